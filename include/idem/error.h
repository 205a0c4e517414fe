/* include/idem/error.h - the one list of libidem's error codes.
 *
 * Every function of libidem that can fail returns an idem_err_t: 0 is
 * success, anything else names what went wrong.  The list is an X-macro so
 * that the enum, idem_strerror() and idem_err_name() can never disagree.
 * The list only grows: a code's number never changes once released.
 * A backend's own detail (an LMDB code, a Redis error string) is not a code
 * here; it is kept by the store and read with idem_store_errstr().
 */
#ifndef IDEM_ERROR_H
#define IDEM_ERROR_H

#include "idem/extern.h"

#define IDEM_ERRORS(X)                                                   \
    X(OK, 0, "success")                                                  \
    X(E_INVAL, 1, "invalid argument")                                    \
    X(E_NOMEM, 2, "out of memory")                                       \
    X(E_TOOBIG, 3, "size limit exceeded")                                \
    X(E_NOTFOUND, 4, "not found")                                        \
    X(E_STORE_DOWN, 5, "store unavailable")                              \
    X(E_STORE_FULL, 6, "store full")                                     \
    X(E_FENCE, 7, "fence does not match: the key was claimed again")     \
    X(E_CORRUPT, 8, "corrupt or foreign record")                         \
    X(E_IO, 9, "input/output error")                                     \
    X(E_EXISTS, 10, "already exists")                                    \
    X(E_UNSUPPORTED, 11, "not supported by this store")                 \
    X(E_RETRY, 12, "the database refused the transaction: roll back and run it again")

typedef enum idem_err {
#define IDEM__ERR_ENUM(name, num, text) IDEM_##name = num,
    IDEM_ERRORS(IDEM__ERR_ENUM)
#undef IDEM__ERR_ENUM
} idem_err_t;

/** A sentence describing err; never NULL, static storage. */
IDEM_EXTERN const char *idem_strerror(idem_err_t err);
/** The code's name without prefix ("E_INVAL"); never NULL, static storage. */
IDEM_EXTERN const char *idem_err_name(idem_err_t err);

#endif /* IDEM_ERROR_H */
