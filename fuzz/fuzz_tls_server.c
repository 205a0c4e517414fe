/* fuzz/fuzz_tls_server.c - libFuzzer target for a TLS server session
 * (src/core/tls.c): what a client of the TLS listener can send before
 * and during the handshake.
 *
 * The input is the client's bytes.  Its first byte picks the piece size
 * (1 to 256) and whether the server asks for a client certificate; the
 * rest is fed in pieces of that size, with a read after each piece and the
 * server's answer taken away.  The certificate is made once, in memory, by
 * OpenSSL (a self-signed P-256 key written to a temporary directory), so the
 * target needs no file of the tree.  Properties checked:
 *   - every read gives 0, a byte count within the buffer, or one of the
 *     IDEM_TLS_E_* codes, and once negative, the same code every time after;
 *   - the ciphertext held stays within IDEM_TLS_MAX_HELD (a feed past it is
 *     refused with IDEM_TLS_E_TOOBIG, and nothing else fails a feed);
 *   - a failed session has a reason; no plaintext comes before the
 *     handshake is done, and no peer certificate is claimed without one.
 */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>

#include "fuzz_check.h"
#include "core/tls.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static idem_tls_ctx_t *plain_ctx, *mtls_ctx;

static void make_pair(const char *crt, const char *key)
{
    EVP_PKEY *pk = EVP_EC_gen("P-256");
    CHECK(pk);
    X509 *x = X509_new();
    CHECK(x);
    ASN1_INTEGER_set(X509_get_serialNumber(x), 1);
    X509_gmtime_adj(X509_getm_notBefore(x), 0);
    X509_gmtime_adj(X509_getm_notAfter(x), 3600L * 24 * 365);
    X509_set_pubkey(x, pk);
    X509_NAME *n = X509_get_subject_name(x);
    X509_NAME_add_entry_by_txt(n, "CN", MBSTRING_ASC, (const unsigned char *)"localhost", -1, -1, 0);
    X509_set_issuer_name(x, n);
    CHECK(X509_sign(x, pk, EVP_sha256()) > 0);
    FILE *f = fopen(crt, "w");
    CHECK(f && PEM_write_X509(f, x) == 1);
    fclose(f);
    f = fopen(key, "w");
    CHECK(f && PEM_write_PrivateKey(f, pk, NULL, NULL, 0, NULL, NULL) == 1);
    fclose(f);
    X509_free(x);
    EVP_PKEY_free(pk);
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc, (void)argv;
    char dir[] = "/tmp/idem-fuzz-tls-XXXXXX";
    CHECK(mkdtemp(dir));
    char crt[128], key[128];
    snprintf(crt, sizeof crt, "%s/c.pem", dir);
    snprintf(key, sizeof key, "%s/k.pem", dir);
    make_pair(crt, key);
    char err[256];
    idem_tls_server_opts_t o = {.cert_file = crt, .key_file = key};
    CHECK(idem__tls_server_ctx_create(&o, &plain_ctx, err, sizeof err) == 0);
    o.client_ca_file = crt; /* itself as the only CA */
    CHECK(idem__tls_server_ctx_create(&o, &mtls_ctx, err, sizeof err) == 0);
    unlink(crt);
    unlink(key);
    rmdir(dir);
    return 0;
}

static bool is_code(int r)
{
    return r == IDEM_TLS_E_CLOSED || r == IDEM_TLS_E_PROTOCOL || r == IDEM_TLS_E_VERIFY ||
           r == IDEM_TLS_E_NOMEM || r == IDEM_TLS_E_TOOBIG;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    size_t piece = (size_t)(data[0] & 0x7f) * 2 + 1;
    bool mtls = data[0] & 0x80;
    data++, size--;
    idem_tls_t *t = idem__tls_create_server(mtls ? mtls_ctx : plain_ctx);
    CHECK(t);
    char buf[512];
    int failed = 0;
    for (size_t off = 0; off < size; off += piece) {
        size_t n = size - off < piece ? size - off : piece;
        int f = idem__tls_feed(t, (const char *)data + off, n);
        CHECK(f == 0 || f == failed || (failed == 0 && f == IDEM_TLS_E_TOOBIG));
        int r = idem__tls_read(t, buf, sizeof buf);
        CHECK(r >= 0 ? (size_t)r <= sizeof buf : is_code(r));
        if (failed)
            CHECK(r == failed);
        if (r > 0)
            CHECK(idem__tls_handshake_done(t));
        if (r < 0) {
            failed = r;
            CHECK(idem__tls_errstr(t)[0] != '\0');
        }
        size_t p = idem__tls_pending(t);
        char out[4096];
        while (p > 0) {
            size_t got = idem__tls_take(t, out, sizeof out);
            CHECK(got > 0 && got <= p);
            p -= got;
        }
        if (f != 0 && !failed)
            failed = f;
    }
    char hex[65];
    if (!idem__tls_handshake_done(t))
        CHECK(!idem__tls_peer_cert_sha256_hex(t, hex) && hex[0] == '\0');
    idem__tls_destroy(t);
    return 0;
}
