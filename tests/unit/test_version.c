/* tests/unit/test_version.c - idem_version() of src/core/version.c against
 * the macros of the generated idem/version.h.
 *
 * The library's runtime version and the header's macros come from one
 * meson project version; these tests catch a header and a library built
 * from different ones, and a string that does not spell the numbers.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>

#include "idem/idem.h"

Test(version, runtime_equals_header_string)
{
    cr_assert_not_null(idem_version());
    cr_expect_str_eq(idem_version(), IDEM_VERSION_STRING);
}

Test(version, string_spells_the_numbers)
{
    char want[64];
    snprintf(want, sizeof want, "%d.%d.%d", IDEM_VERSION_MAJOR, IDEM_VERSION_MINOR,
             IDEM_VERSION_PATCH);
    cr_expect_str_eq(idem_version(), want);
}

Test(version, number_orders_releases)
{
    cr_expect_eq(IDEM_VERSION_NUMBER,
                 IDEM_VERSION_MAJOR * 10000 + IDEM_VERSION_MINOR * 100 + IDEM_VERSION_PATCH);
    cr_expect(IDEM_VERSION_MINOR < 100 && IDEM_VERSION_PATCH < 100);
}
