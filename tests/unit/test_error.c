/* tests/unit/test_error.c - the error list of src/core/error.c.
 *
 * The numbers are part of the ABI (the list only grows), and the names and
 * texts are what logs and problem details show, so each is pinned here.
 */
#include <criterion/criterion.h>
#include <string.h>

#include "idem/error.h"

struct expect {
    idem_err_t code;
    int num;
    const char *name;
    const char *text;
};

static const struct expect all[] = {
    {IDEM_OK, 0, "OK", "success"},
    {IDEM_E_INVAL, 1, "E_INVAL", "invalid argument"},
    {IDEM_E_NOMEM, 2, "E_NOMEM", "out of memory"},
    {IDEM_E_TOOBIG, 3, "E_TOOBIG", "size limit exceeded"},
    {IDEM_E_NOTFOUND, 4, "E_NOTFOUND", "not found"},
    {IDEM_E_STORE_DOWN, 5, "E_STORE_DOWN", "store unavailable"},
    {IDEM_E_STORE_FULL, 6, "E_STORE_FULL", "store full"},
    {IDEM_E_FENCE, 7, "E_FENCE", "fence does not match: the key was claimed again"},
    {IDEM_E_CORRUPT, 8, "E_CORRUPT", "corrupt or foreign record"},
    {IDEM_E_IO, 9, "E_IO", "input/output error"},
    {IDEM_E_EXISTS, 10, "E_EXISTS", "already exists"},
    {IDEM_E_UNSUPPORTED, 11, "E_UNSUPPORTED", "not supported by this store"},
    {IDEM_E_RETRY, 12, "E_RETRY", "the database refused the transaction: roll back and run it again"},
};
#define N_ALL (sizeof all / sizeof all[0])

Test(error, numbers_never_change)
{
    for (size_t i = 0; i < N_ALL; i++)
        cr_expect_eq((int)all[i].code, all[i].num, "%s", all[i].name);
}

Test(error, name_of_each_code)
{
    for (size_t i = 0; i < N_ALL; i++)
        cr_expect_str_eq(idem_err_name(all[i].code), all[i].name);
}

Test(error, text_of_each_code)
{
    for (size_t i = 0; i < N_ALL; i++)
        cr_expect_str_eq(idem_strerror(all[i].code), all[i].text);
}

Test(error, every_listed_code_is_tested)
{
    size_t n = 0;
#define COUNT(name, num, text) n++;
    IDEM_ERRORS(COUNT)
#undef COUNT
    cr_assert_eq(n, N_ALL, "a code was added to IDEM_ERRORS: pin it in this file");
}

Test(error, unknown_code_has_a_printable_name_and_text)
{
    cr_expect_str_eq(idem_err_name((idem_err_t)9999), "E_UNKNOWN");
    cr_expect_str_eq(idem_strerror((idem_err_t)9999), "unknown error");
    cr_expect_str_eq(idem_err_name((idem_err_t)-1), "E_UNKNOWN");
    cr_expect_str_eq(idem_strerror((idem_err_t)-1), "unknown error");
}
