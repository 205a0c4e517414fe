/* src/core/error.c - the text and the name of every libidem error code.
 *
 * Both tables are generated from the one X-macro in include/idem/error.h, so
 * adding a code there is all it takes; nothing here can fall out of step
 * with the enum.  A value that is not in the list (a corrupted variable, a
 * code from a newer library) gets "unknown error" / "E_UNKNOWN" rather than
 * NULL, so a caller can always print the result.
 *
 * THREADING: pure functions over static data.
 */
#include "idem/error.h"

const char *idem_strerror(idem_err_t err)
{
    switch (err) {
#define IDEM__ERR_TEXT(name, num, text) \
    case IDEM_##name:                   \
        return text;
        IDEM_ERRORS(IDEM__ERR_TEXT)
#undef IDEM__ERR_TEXT
    }
    return "unknown error";
}

const char *idem_err_name(idem_err_t err)
{
    switch (err) {
#define IDEM__ERR_NAME(name, num, text) \
    case IDEM_##name:                   \
        return #name;
        IDEM_ERRORS(IDEM__ERR_NAME)
#undef IDEM__ERR_NAME
    }
    return "E_UNKNOWN";
}
