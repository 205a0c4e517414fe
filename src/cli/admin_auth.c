/* src/cli/admin_auth.c - the admin token idemctl's admin commands send.
 *
 * idemd's admin listener may need `Authorization: Bearer <token>`
 * (admin_token_file, SPEC section 19).  idemctl reads the same kind of
 * file: --admin-token-file, else $IDEM_ADMIN_TOKEN_FILE, so the token is
 * never on a command line where ps shows it.  The file is read as idemd
 * reads its own: trailing CR and LF dropped, the rest one token of visible
 * ASCII.  Every admin command (keys.c) calls idem__cli_admin_auth before
 * it sends.
 *
 * THREADING: one thread.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <curl/curl.h>

#include "cli/cli.h"

#define TOKEN_MAX 4096

int idem__cli_admin_auth(const idem_cli_args_t *a, struct curl_slist **hdrs)
{
    const char *path = a->admin_token_file;
    const char *from = "--admin-token-file";
    if (path == NULL) {
        path = getenv("IDEM_ADMIN_TOKEN_FILE");
        from = "IDEM_ADMIN_TOKEN_FILE";
        if (path == NULL || *path == '\0')
            return IDEM_CLI_EXIT_OK; /* no token: an admin without one */
    }
    char line[sizeof "Authorization: Bearer " + TOKEN_MAX + 2];
    size_t pre = sizeof "Authorization: Bearer " - 1;
    memcpy(line, "Authorization: Bearer ", pre);
    FILE *f = fopen(path, "rbe");
    if (f == NULL) {
        fprintf(stderr, "idemctl: %s: cannot open '%s': %s\n", from, path, strerror(errno));
        return IDEM_CLI_EXIT_USAGE;
    }
    size_t n = fread(line + pre, 1, TOKEN_MAX + 2, f);
    bool read_err = ferror(f) != 0;
    fclose(f);
    while (n > 0 && (line[pre + n - 1] == '\n' || line[pre + n - 1] == '\r'))
        n--;
    const char *why = read_err          ? "cannot be read"
                      : n == 0          ? "is empty"
                      : n > TOKEN_MAX   ? "holds more than 4096 bytes"
                                        : NULL;
    for (size_t i = 0; why == NULL && i < n; i++)
        if ((unsigned char)line[pre + i] < 0x21 || (unsigned char)line[pre + i] > 0x7e)
            why = "holds a space, a control character or a byte outside ASCII";
    if (why != NULL) {
        fprintf(stderr, "idemctl: %s: '%s' %s\n", from, path, why);
        return IDEM_CLI_EXIT_USAGE;
    }
    line[pre + n] = '\0';
    struct curl_slist *t = curl_slist_append(*hdrs, line);
    memset(line, 0, sizeof line);
    if (t == NULL) {
        fprintf(stderr, "idemctl: out of memory\n");
        return IDEM_CLI_EXIT_NOMEM;
    }
    *hdrs = t;
    return IDEM_CLI_EXIT_OK;
}
