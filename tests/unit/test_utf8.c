/* tests/unit/test_utf8.c - the one UTF-8 check (src/core/utf8.c): the
 * boundaries of RFC 3629's table one by one, then every sequence of one to
 * three bytes and every four-byte lead against a decoder written the other
 * way (assemble the code point, then judge it). */
#include <criterion/criterion.h>
#include <stdint.h>
#include <string.h>

#include "core/utf8.h"

static bool valid(const char *s)
{
    return idem__utf8_valid(s, strlen(s));
}

Test(utf8, ascii_and_the_empty_string)
{
    cr_expect(idem__utf8_valid("", 0));
    cr_expect(idem__utf8_valid(NULL, 0), "no byte is read when len is 0");
    cr_expect(valid("plain ASCII ~!@#"));
    cr_expect(valid("\x7f"));
    /* A NUL inside len is U+0000; callers that hold C strings pass strlen. */
    cr_expect(idem__utf8_valid("a\0b", 3));
}

Test(utf8, the_first_and_last_of_every_length)
{
    cr_expect(valid("\xc2\x80"));             /* U+0080 */
    cr_expect(valid("\xdf\xbf"));             /* U+07FF */
    cr_expect(valid("\xe0\xa0\x80"));         /* U+0800 */
    cr_expect(valid("\xed\x9f\xbf"));         /* U+D7FF, below the surrogates */
    cr_expect(valid("\xee\x80\x80"));         /* U+E000, above them */
    cr_expect(valid("\xef\xbf\xbf"));         /* U+FFFF */
    cr_expect(valid("\xf0\x90\x80\x80"));     /* U+10000 */
    cr_expect(valid("\xf4\x8f\xbf\xbf"));     /* U+10FFFF, the last code point */
    cr_expect(valid("caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80"));
}

Test(utf8, overlong_forms_are_refused)
{
    cr_expect_not(valid("\xc0\x80"), "NUL in two bytes");
    cr_expect_not(valid("\xc0\xaf"), "'/' in two bytes");
    cr_expect_not(valid("\xc1\xbf"));
    cr_expect_not(valid("\xe0\x80\x80"));
    cr_expect_not(valid("\xe0\x9f\xbf"), "U+07FF in three bytes");
    cr_expect_not(valid("\xf0\x80\x80\x80"));
    cr_expect_not(valid("\xf0\x8f\xbf\xbf"), "U+FFFF in four bytes");
}

Test(utf8, surrogates_and_what_lies_past_u10ffff_are_refused)
{
    cr_expect_not(valid("\xed\xa0\x80"), "U+D800");
    cr_expect_not(valid("\xed\xaf\xbf"), "U+DBFF");
    cr_expect_not(valid("\xed\xb0\x80"), "U+DC00");
    cr_expect_not(valid("\xed\xbf\xbf"), "U+DFFF");
    cr_expect_not(valid("\xed\xa0\xbd\xed\xb8\x80"), "a CESU-8 pair");
    cr_expect_not(valid("\xf4\x90\x80\x80"), "U+110000");
    cr_expect_not(valid("\xf5\x80\x80\x80"));
    cr_expect_not(valid("\xf7\xbf\xbf\xbf"));
    cr_expect_not(valid("\xf8\x88\x80\x80\x80"), "five bytes");
    cr_expect_not(valid("\xfc\x84\x80\x80\x80\x80"), "six bytes");
    cr_expect_not(valid("\xfe"));
    cr_expect_not(valid("\xff"));
}

Test(utf8, stray_and_missing_continuation_bytes_are_refused)
{
    cr_expect_not(valid("\x80"));
    cr_expect_not(valid("a\xbf"));
    cr_expect_not(valid("\xc3\xa9\xa9"), "one continuation too many");
    cr_expect_not(valid("\xc3" "A"));
    cr_expect_not(valid("\xe2\x82" "A"));
    cr_expect_not(valid("\xf0\x9f\x98" "A"));
    cr_expect_not(valid("\xe2" "A" "\xac"));
}

Test(utf8, a_sequence_cut_short_by_the_end_is_refused)
{
    const char *seqs[] = {"\xc3\xa9", "\xe2\x82\xac", "\xf0\x9f\x98\x80"};
    for (size_t i = 0; i < 3; i++) {
        size_t n = strlen(seqs[i]);
        cr_expect(idem__utf8_valid(seqs[i], n));
        for (size_t cut = 1; cut < n; cut++)
            cr_expect_not(idem__utf8_valid(seqs[i], cut), "sequence %zu cut at %zu", i, cut);
    }
    /* The length is the caller's: bytes past it are never read. */
    cr_expect(idem__utf8_valid("ab\xff", 2));
}

/* The other way round: assemble the code point from the bit patterns, then
 * refuse it if it is overlong, a surrogate or too large. */
static bool reference(const uint8_t *s, size_t len)
{
    size_t i = 0;
    while (i < len) {
        uint32_t c = s[i];
        size_t more;
        uint32_t min;
        if (c < 0x80) {
            i++;
            continue;
        } else if ((c & 0xe0) == 0xc0) {
            more = 1, min = 0x80, c &= 0x1f;
        } else if ((c & 0xf0) == 0xe0) {
            more = 2, min = 0x800, c &= 0x0f;
        } else if ((c & 0xf8) == 0xf0) {
            more = 3, min = 0x10000, c &= 0x07;
        } else {
            return false;
        }
        if (len - i - 1 < more)
            return false;
        for (size_t j = 1; j <= more; j++) {
            if ((s[i + j] & 0xc0) != 0x80)
                return false;
            c = (c << 6) | (s[i + j] & 0x3f);
        }
        if (c < min || c > 0x10ffff || (c >= 0xd800 && c <= 0xdfff))
            return false;
        i += more + 1;
    }
    return true;
}

Test(utf8, every_sequence_up_to_three_bytes_agrees_with_a_reference)
{
    uint8_t b[3];
    size_t valid3 = 0;
    for (uint32_t x = 0; x < 0x1000000; x++) {
        b[0] = (uint8_t)(x >> 16);
        b[1] = (uint8_t)(x >> 8);
        b[2] = (uint8_t)x;
        bool got = idem__utf8_valid(b, 3);
        if (got != reference(b, 3))
            cr_assert_fail("%02x %02x %02x: %d", b[0], b[1], b[2], got);
        valid3 += got && b[0] >= 0xe0;
        if ((uint8_t)x == 0 && idem__utf8_valid(b, 2) != reference(b, 2))
            cr_assert_fail("%02x %02x", b[0], b[1]);
    }
    /* Three-byte code points: U+0800..U+FFFF less 2048 surrogates. */
    cr_expect_eq(valid3, 0x10000 - 0x800 - 0x800);
}

Test(utf8, every_code_point_encodes_to_a_valid_sequence)
{
    for (uint32_t c = 0; c <= 0x10ffff; c++) {
        uint8_t b[4];
        size_t n;
        if (c < 0x80) {
            b[0] = (uint8_t)c, n = 1;
        } else if (c < 0x800) {
            b[0] = (uint8_t)(0xc0 | c >> 6), b[1] = (uint8_t)(0x80 | (c & 0x3f)), n = 2;
        } else if (c < 0x10000) {
            b[0] = (uint8_t)(0xe0 | c >> 12), b[1] = (uint8_t)(0x80 | ((c >> 6) & 0x3f));
            b[2] = (uint8_t)(0x80 | (c & 0x3f)), n = 3;
        } else {
            b[0] = (uint8_t)(0xf0 | c >> 18), b[1] = (uint8_t)(0x80 | ((c >> 12) & 0x3f));
            b[2] = (uint8_t)(0x80 | ((c >> 6) & 0x3f)), b[3] = (uint8_t)(0x80 | (c & 0x3f));
            n = 4;
        }
        bool surrogate = c >= 0xd800 && c <= 0xdfff;
        if (idem__utf8_valid(b, n) == surrogate)
            cr_assert_fail("U+%04X", c);
    }
}

Test(utf8, four_byte_sequences_agree_with_the_reference)
{
    /* Every lead F0..FF and second byte, with third and fourth bytes at the
     * edges of the continuation range and just outside it. */
    const uint8_t edge[] = {0x00, 0x41, 0x7f, 0x80, 0x8f, 0x90, 0x9f, 0xa0, 0xbf, 0xc0, 0xff};
    uint8_t b[4];
    for (unsigned lead = 0xf0; lead <= 0xff; lead++) {
        for (unsigned second = 0; second < 256; second++) {
            for (size_t i = 0; i < sizeof edge; i++) {
                for (size_t j = 0; j < sizeof edge; j++) {
                    b[0] = (uint8_t)lead;
                    b[1] = (uint8_t)second;
                    b[2] = edge[i];
                    b[3] = edge[j];
                    if (idem__utf8_valid(b, 4) != reference(b, 4))
                        cr_assert_fail("%02x %02x %02x %02x", b[0], b[1], b[2], b[3]);
                }
            }
        }
    }
}
