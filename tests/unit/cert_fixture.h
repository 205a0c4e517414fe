/* tests/unit/cert_fixture.h - the test certificates (tests/certs.py, made
 * by the build into $IDEM_TEST_CERTS) for the TLS unit tests (test_tls,
 * test_transport, test_upstream); linked by tests/unit/meson.build. */
#ifndef IDEM_TESTS_CERT_FIXTURE_H
#define IDEM_TESTS_CERT_FIXTURE_H

/* The path of the test set's file name; one of 8 buffers in turn, so that
 * up to 8 paths may be held at once. */
const char *tcert(const char *name);

/* The lowercase hex SHA-256 of the DER of the first certificate in path,
 * made with OpenSSL directly so that the code under test does not check
 * itself. */
void tcert_der_sha256(const char *path, char out[65]);

#endif
