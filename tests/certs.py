#!/usr/bin/env python3
"""tests/certs.py - the certificates the TLS tests use, made with the
`openssl` command (Debian's package `openssl`) into a directory.

    python3 tests/certs.py DIR          (the unit tests' meson target)
    from certs import make_certs        (the black-box tests)
    paths = make_certs(dirpath)         # {'ca': '/dir/ca.pem', ...}

What it makes (EC P-256 keys, so it takes a fraction of a second):

    ca.pem ca.key                  the test CA
    other-ca.pem other-ca.key      another CA, that nothing trusts
    server.pem server.key          by the CA, for localhost and 127.0.0.1 (SAN)
    wrong-name.pem wrong-name.key  by the CA, for other.invalid only
    expired.pem expired.key        by the CA, for localhost and 127.0.0.1,
                                   valid in 2020 only (`openssl ca` -startdate
                                   and -enddate: OpenSSL 3.0's x509 has no
                                   -not_before)
    client-a.pem client-a.key      client certificates (clientAuth) by the CA
    client-b.pem client-b.key
    client-other.pem client-other.key   a client certificate by the other CA
    server2.pem server2.key        by the CA, for the same names as server.pem
                                   (another key and serial): the certificate
                                   a SIGHUP test swaps in

make_certs returns a dict of the paths by name: 'ca', 'ca_key', 'other_ca',
'other_ca_key', 'server', 'server_key', 'wrong_name', 'wrong_name_key',
'expired', 'expired_key', 'client_a', 'client_a_key', 'client_b',
'client_b_key', 'client_other', 'client_other_key', 'server2',
'server2_key'.  The files are made
afresh each time (new keys); the configuration given to openssl is this
file's own, so the system's openssl.cnf changes nothing.
"""
import os
import subprocess
import sys

_CNF = """\
[req]
distinguished_name = dn
prompt = no
[dn]
CN = unused

[ca_ext]
basicConstraints = critical,CA:TRUE
keyUsage = critical,keyCertSign,cRLSign
subjectKeyIdentifier = hash

[server_ext]
basicConstraints = critical,CA:FALSE
keyUsage = critical,digitalSignature
extendedKeyUsage = serverAuth
subjectAltName = DNS:localhost,IP:127.0.0.1
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid

[wrong_name_ext]
basicConstraints = critical,CA:FALSE
keyUsage = critical,digitalSignature
extendedKeyUsage = serverAuth
subjectAltName = DNS:other.invalid
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid

[client_ext]
basicConstraints = critical,CA:FALSE
keyUsage = critical,digitalSignature
extendedKeyUsage = clientAuth
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid

[ca]
default_ca = test_ca
[test_ca]
database = {dir}/.ca-index.txt
new_certs_dir = {dir}/.ca-new
serial = {dir}/.ca-serial
default_md = sha256
policy = any_name
unique_subject = no
email_in_dn = no
[any_name]
commonName = supplied
"""


def _run(*args):
    r = subprocess.run(["openssl", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       text=True, check=False)
    if r.returncode != 0:
        raise RuntimeError("openssl %s failed: %s" % (" ".join(args), r.stderr.strip()))


def _key(path):
    _run("genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", path)


def make_certs(dirpath):
    """Make every certificate and key into dirpath (created if needed) and
    return their paths by name."""
    d = os.path.abspath(dirpath)
    os.makedirs(d, exist_ok=True)
    os.makedirs(os.path.join(d, ".ca-new"), exist_ok=True)
    cnf = os.path.join(d, ".openssl.cnf")
    with open(cnf, "w", encoding="ascii") as f:
        f.write(_CNF.format(dir=d))
    with open(os.path.join(d, ".ca-index.txt"), "w", encoding="ascii"):
        pass
    with open(os.path.join(d, ".ca-serial"), "w", encoding="ascii") as f:
        f.write("1000\n")

    def p(name):
        return os.path.join(d, name)

    def make_ca(stem, cn):
        _key(p(stem + ".key"))
        _run("req", "-config", cnf, "-new", "-x509", "-key", p(stem + ".key"), "-subj", "/CN=" + cn,
             "-days", "3650", "-sha256", "-extensions", "ca_ext", "-out", p(stem + ".pem"))

    serial = [1]

    def make_leaf(stem, cn, ca, ext):
        _key(p(stem + ".key"))
        _run("req", "-config", cnf, "-new", "-key", p(stem + ".key"), "-subj", "/CN=" + cn,
             "-out", p(stem + ".csr"))
        serial[0] += 1
        _run("x509", "-req", "-in", p(stem + ".csr"), "-CA", p(ca + ".pem"), "-CAkey",
             p(ca + ".key"), "-set_serial", str(serial[0]), "-days", "3650", "-sha256",
             "-extfile", cnf, "-extensions", ext, "-out", p(stem + ".pem"))
        os.unlink(p(stem + ".csr"))

    make_ca("ca", "idem test CA")
    make_ca("other-ca", "idem other CA")
    make_leaf("server", "localhost", "ca", "server_ext")
    make_leaf("wrong-name", "other.invalid", "ca", "wrong_name_ext")
    make_leaf("client-a", "client-a", "ca", "client_ext")
    make_leaf("client-b", "client-b", "ca", "client_ext")
    make_leaf("client-other", "client-other", "other-ca", "client_ext")
    make_leaf("server2", "localhost", "ca", "server_ext")

    # Expired: validity in the past, through `openssl ca`.
    _key(p("expired.key"))
    _run("req", "-config", cnf, "-new", "-key", p("expired.key"), "-subj", "/CN=localhost",
         "-out", p("expired.csr"))
    _run("ca", "-batch", "-config", cnf, "-cert", p("ca.pem"), "-keyfile", p("ca.key"),
         "-in", p("expired.csr"), "-out", p("expired.pem"), "-notext",
         "-startdate", "20200101000000Z", "-enddate", "20200201000000Z",
         "-extfile", cnf, "-extensions", "server_ext")
    os.unlink(p("expired.csr"))

    names = {}
    for stem in ("ca", "other-ca", "server", "wrong-name", "expired", "client-a", "client-b",
                 "client-other", "server2"):
        key = stem.replace("-", "_")
        names[key] = p(stem + ".pem")
        names[key + "_key"] = p(stem + ".key")
    return names


def main(argv):
    if len(argv) != 2:
        print("usage: certs.py DIR", file=sys.stderr)
        return 2
    make_certs(argv[1])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
