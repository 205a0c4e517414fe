/* src/core/version.c - the library's own version, for a program to ask at
 * run time.
 *
 * The string is the one idem/version.h was generated with when this library
 * was built, so a program can compare it with the IDEM_VERSION_STRING it was
 * compiled against.
 *
 * THREADING: a pure function over static data.
 */
#include "idem/version.h"

const char *idem_version(void)
{
    return IDEM_VERSION_STRING;
}
