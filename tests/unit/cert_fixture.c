/* tests/unit/cert_fixture.c - the test certificates' paths and digests for
 * the TLS unit tests (see cert_fixture.h). */
#include "cert_fixture.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>

#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>

const char *tcert(const char *name)
{
    static char bufs[8][512];
    static int next;
    const char *dir = getenv("IDEM_TEST_CERTS");
    cr_assert(dir, "IDEM_TEST_CERTS is not set (run through meson test)");
    char *b = bufs[next++ % 8];
    snprintf(b, sizeof bufs[0], "%s/%s", dir, name);
    return b;
}

void tcert_der_sha256(const char *path, char out[65])
{
    FILE *f = fopen(path, "r");
    cr_assert(f, "%s", path);
    X509 *x = PEM_read_X509(f, NULL, NULL, NULL);
    fclose(f);
    cr_assert(x);
    unsigned char *der = NULL;
    int n = i2d_X509(x, &der);
    cr_assert(n > 0);
    unsigned char md[32];
    unsigned len = 0;
    cr_assert(EVP_Digest(der, (size_t)n, md, &len, EVP_sha256(), NULL) == 1);
    for (unsigned i = 0; i < 32; i++)
        snprintf(out + 2 * i, 3, "%02x", md[i]);
    OPENSSL_free(der);
    X509_free(x);
}
