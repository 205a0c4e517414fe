/* src/cli/cli.h - what idemctl's commands share: exit codes and the commands.
 *
 * Exit codes follow curl where curl has one for the same thing, so a script
 * written for curl --fail reads idemctl the same way:
 *
 *   0   a 2xx answer (keys delete: 200 or 204; token: 201); conformance: no check failed
 *   1   conformance: a check failed
 *   2   usage: a bad flag, value, URL, header, key or --data-file
 *   7   no answer at all: every attempt failed to connect, timed out or broke
 *   22  an HTTP answer other than success (its body is still printed)
 *   23  the output could not be written (curl's CURLE_WRITE_ERROR)
 *   27  out of memory (curl's CURLE_OUT_OF_MEMORY)
 *   63  the answer was larger than 64 MiB (curl's CURLE_FILESIZE_EXCEEDED)
 *
 * Whenever idemctl exits with anything but 0 it says why in one line on
 * stderr, starting "idemctl: ".
 *
 * THREADING: one thread.
 */
#ifndef IDEM_CLI_CLI_H
#define IDEM_CLI_CLI_H

#include <stddef.h>

#include "cli/args.h"
#include "idem/version.h"

#define IDEM_CLI_EXIT_OK 0
#define IDEM_CLI_EXIT_CONFORMANCE 1
#define IDEM_CLI_EXIT_USAGE 2
#define IDEM_CLI_EXIT_NO_ANSWER 7
#define IDEM_CLI_EXIT_HTTP 22
#define IDEM_CLI_EXIT_WRITE 23
#define IDEM_CLI_EXIT_NOMEM 27
#define IDEM_CLI_EXIT_TOO_BIG 63

#define IDEM_CLI_USER_AGENT "idemctl/" IDEM_VERSION_STRING

/** idemctl request: send with retries (request.c).  @return the exit code. */
int idem__cli_request(const idem_cli_args_t *a);

/** idemctl keys get|delete (keys.c).  @return the exit code. */
int idem__cli_keys(const idem_cli_args_t *a);
/* idemctl keys list, and keys delete with filters (GET/DELETE {admin}/keys?...). */
int idem__cli_keys_bulk(const idem_cli_args_t *a);

/** idemctl token (keys.c).  @return the exit code. */
int idem__cli_token(const idem_cli_args_t *a);

/** idemctl conformance: check an API against the Idempotency-Key draft
 * and its published policy (conformance.c).  @return the exit code. */
int idem__cli_conformance(const idem_cli_args_t *a);

/** The admin listener's token (admin_auth.c): read the file of
 * --admin-token-file, else of $IDEM_ADMIN_TOKEN_FILE when set and not
 * empty, and append "Authorization: Bearer TOKEN" to *hdrs.  Neither: no
 * header, IDEM_CLI_EXIT_OK.  Every admin command calls it.
 * @return IDEM_CLI_EXIT_OK, or the exit code after one line on stderr
 *         (IDEM_CLI_EXIT_USAGE: the file cannot be read or holds no token). */
struct curl_slist;
int idem__cli_admin_auth(const idem_cli_args_t *a, struct curl_slist **hdrs);

/** Write n bytes to stdout and flush.  @return 0, or -1 after printing why. */
int idem__cli_write_out(const void *p, size_t n);

#endif /* IDEM_CLI_CLI_H */
