/* tests/unit/test_space.c - idemd's watch on its store's room (src/gateway/space.c).
 *
 * The level rule (warning line, full, the margin before "room again") is a
 * pure function and is tested as one.  The watch itself runs against real
 * stores: memory:, which cannot say (no gauges, asked once), and a real
 * RocksDB directory, made full at once by a min_free larger than any disk
 * (skipped on a build without RocksDB, or a filesystem with 16 TiB free).
 * Time is passed in, so "once a second" needs no sleep.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "gateway/metrics.h"
#include "gateway/space.h"

#define GIB (1ull << 30)
#define MIB (1ull << 20)
#define SEC 1000000000ull

/* ---- the level rule ---------------------------------------------------------- */

Test(space, line_is_the_larger_of_1gib_and_a_tenth_of_the_reach)
{
    cr_expect_eq(idem__space_low_line(0, 100 * MIB), GIB);
    cr_expect_eq(idem__space_low_line(5 * GIB, 4 * GIB), GIB);
    cr_expect_eq(idem__space_low_line(50 * GIB, 50 * GIB), 10 * GIB);
    /* no overflow at the edges */
    cr_expect_eq(idem__space_low_line(UINT64_MAX, UINT64_MAX), 2 * (UINT64_MAX / 10));
}

Test(space, zero_free_is_full_from_any_level)
{
    for (int l = IDEM_SPACE_UNKNOWN; l <= IDEM_SPACE_FULL; l++)
        cr_expect_eq(idem__space_level((idem_space_level_t)l, 10 * GIB, 0), IDEM_SPACE_FULL);
}

Test(space, below_the_line_is_low_and_at_it_ok)
{
    /* used 10 GiB: the line is 1 GiB until used + free passes 10 GiB */
    cr_expect_eq(idem__space_level(IDEM_SPACE_UNKNOWN, 10 * GIB, GIB - 1), IDEM_SPACE_LOW);
    cr_expect_eq(idem__space_level(IDEM_SPACE_OK, 10 * GIB, GIB - 1), IDEM_SPACE_LOW);
    cr_expect_eq(idem__space_level(IDEM_SPACE_UNKNOWN, 8 * GIB, GIB), IDEM_SPACE_OK);
    cr_expect_eq(idem__space_level(IDEM_SPACE_OK, 8 * GIB, GIB), IDEM_SPACE_OK);
    /* a large store: a tenth of 100 GiB */
    cr_expect_eq(idem__space_level(IDEM_SPACE_OK, 91 * GIB, 9 * GIB), IDEM_SPACE_LOW);
    cr_expect_eq(idem__space_level(IDEM_SPACE_OK, 89 * GIB, 11 * GIB), IDEM_SPACE_OK);
}

Test(space, back_to_ok_only_a_quarter_above_the_line)
{
    /* line 1 GiB: from LOW or FULL, OK again only at 1.25 GiB */
    cr_expect_eq(idem__space_level(IDEM_SPACE_LOW, 0, GIB + GIB / 8), IDEM_SPACE_LOW);
    cr_expect_eq(idem__space_level(IDEM_SPACE_FULL, 0, GIB + GIB / 8), IDEM_SPACE_LOW);
    cr_expect_eq(idem__space_level(IDEM_SPACE_FULL, 0, 1), IDEM_SPACE_LOW);
    cr_expect_eq(idem__space_level(IDEM_SPACE_LOW, 0, GIB + GIB / 4), IDEM_SPACE_OK);
    cr_expect_eq(idem__space_level(IDEM_SPACE_FULL, 0, GIB + GIB / 4), IDEM_SPACE_OK);
}

/* ---- the watch, on real stores --------------------------------------------- */

static char *render(idem_metrics_t *m)
{
    idem_buf_t b;
    idem__buf_init(&b, 1u << 20);
    cr_assert_eq(idem__metrics_render(m, NULL, &b), 0);
    cr_assert(idem__buf_append(&b, "", 1) == 0);
    return b.data;
}

Test(space, a_store_that_cannot_say_is_asked_once_and_shows_no_gauges)
{
    static idem_metrics_t m;
    idem_store_t *s;
    cr_assert_eq(idem_store_open("memory:", &s, NULL, 0), IDEM_OK);
    idem_space_watch_t w = {0};
    idem_space_note_t note;
    cr_expect(idem__space_look(&w, s, &m, 5 * SEC, SEC, &note));
    cr_expect_null(note.level);
    cr_expect(w.unsupported);
    cr_expect(!idem__space_look(&w, s, &m, 100 * SEC, SEC, &note), "asked again");
    cr_expect_not(atomic_load(&m.store_space_known));
    char *t = render(&m);
    cr_expect_null(strstr(t, "idem_store_free_bytes"));
    cr_expect_null(strstr(t, "idem_store_used_bytes"));
    free(t);
    idem_store_close(s);
}

static char dir[64];

static int rm_one(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb;
    (void)flag;
    (void)ftw;
    return remove(path);
}

static void make_dir(void)
{
    snprintf(dir, sizeof dir, "/tmp/idem-space-XXXXXX");
    cr_assert_not_null(mkdtemp(dir), "mkdtemp: %s", strerror(errno));
}

static void remove_dir(void)
{
    nftw(dir, rm_one, 16, FTW_DEPTH | FTW_PHYS);
}

static uint64_t fs_avail(void)
{
    struct statvfs v;
    cr_assert_eq(statvfs(dir, &v), 0);
    return (uint64_t)v.f_bavail * v.f_frsize;
}

/* Open rocksdb:DIR/db with the query q; skips without RocksDB. */
static idem_store_t *open_rocks(const char *q)
{
    char url[160], err[256] = "";
    idem_store_t *s = NULL;
    snprintf(url, sizeof url, "rocksdb:%s/db%s", dir, q);
    idem_err_t rc = idem_store_open(url, &s, err, sizeof err);
    if (rc == IDEM_E_UNSUPPORTED)
        cr_skip_test("this build has no RocksDB");
    cr_assert_eq(rc, IDEM_OK, "%s", err);
    return s;
}

Test(space, a_full_store_is_said_once_and_room_again_once, .init = make_dir, .fini = remove_dir)
{
    static idem_metrics_t m;
    if (fs_avail() >= (16ull << 40))
        cr_skip_test("the test's filesystem has 16 TiB free");
    if (fs_avail() < 2 * GIB)
        cr_skip_test("the test's filesystem has under 2 GiB free");
    idem_space_watch_t w = {0};
    idem_space_note_t note;

    idem_store_t *s = open_rocks("?min_free=16384GiB");
    cr_assert(idem__space_look(&w, s, &m, 5 * SEC, SEC, &note));
    cr_expect_eq(w.level, IDEM_SPACE_FULL);
    cr_assert_not_null(note.level);
    cr_expect_str_eq(note.level, "error");
    cr_expect(strstr(note.line, "no room") != NULL, "%s", note.line);
    cr_expect(atomic_load(&m.store_space_known));
    cr_expect_eq(atomic_load(&m.store_free_bytes), 0);
    cr_expect_gt(atomic_load(&m.store_used_bytes), 0);
    char *t = render(&m);
    cr_expect(strstr(t, "\nidem_store_free_bytes 0\n") != NULL);
    cr_expect(strstr(t, "# TYPE idem_store_used_bytes gauge\n") != NULL);
    free(t);
    /* within the second: not asked; after it: asked, still full, nothing to say */
    cr_expect(!idem__space_look(&w, s, &m, 5 * SEC + SEC / 2, SEC, &note));
    cr_expect(idem__space_look(&w, s, &m, 6 * SEC, SEC, &note));
    cr_expect_null(note.level);
    idem_store_close(s);

    /* the same directory with the default reserve: room again, said once */
    s = open_rocks("");
    cr_assert(idem__space_look(&w, s, &m, 7 * SEC, SEC, &note));
    cr_expect_eq(w.level, IDEM_SPACE_OK);
    cr_assert_not_null(note.level);
    cr_expect_str_eq(note.level, "info");
    cr_expect(strstr(note.line, "room again") != NULL, "%s", note.line);
    cr_expect_gt(atomic_load(&m.store_free_bytes), 0);
    cr_expect(idem__space_look(&w, s, &m, 8 * SEC, SEC, &note));
    cr_expect_null(note.level);
    idem_store_close(s);
}

Test(space, a_store_with_room_says_nothing_at_start, .init = make_dir, .fini = remove_dir)
{
    static idem_metrics_t m;
    if (fs_avail() < 2 * GIB)
        cr_skip_test("the test's filesystem has under 2 GiB free");
    idem_space_watch_t w = {0};
    idem_space_note_t note;
    idem_store_t *s = open_rocks("");
    cr_assert(idem__space_look(&w, s, &m, 1, SEC, &note));
    cr_expect(atomic_load(&m.store_space_known));
    uint64_t used = atomic_load(&m.store_used_bytes), free_b = atomic_load(&m.store_free_bytes);
    cr_expect_gt(free_b, 0);
    /* OK says nothing; a disk this full already says so at start */
    if (free_b >= idem__space_low_line(used, free_b))
        cr_expect_null(note.level, "%s", note.line);
    else
        cr_expect_str_eq(note.level, "warn");
    idem_store_close(s);
}
