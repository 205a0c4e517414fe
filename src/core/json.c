/* src/core/json.c - canonical JSON: what fingerprint_body: json hashes.
 *
 * Two JSON texts that mean the same payload must give one canonical form,
 * and two texts that an upstream could read as different payloads must
 * never do so (docs/protocol.md section 4).  The form is RFC 8259 JSON with
 * no white space, object members sorted by key, one spelling per string and
 * one per number; the members named by the fingerprint_ignore pointers are
 * left out.
 *
 * THE CANONICAL FORM
 *   - Object members are sorted by their keys' UTF-8 bytes after escapes are
 *     decoded (memcmp order, a prefix first: "" < "A" < "a" < "ab" < "é";
 *     the same as code-point order).
 *   - Strings are written as UTF-8 with the fewest escapes: \" and \\, \b \f
 *     \n \r \t, \u00XX (upper-case hex) for the other characters below
 *     U+0020, and every other character as itself ("\u00e9" and "é", "\/"
 *     and "/" are one string).  This is byte for byte what jansson wrote
 *     before this file replaced it, so fingerprints of JSON bodies whose
 *     numbers are integers did not change.
 *   - Numbers are exact decimals; no binary float is involved anywhere.  A
 *     number is its sign, its significant digits d1..dn (no leading or
 *     trailing zero) and the k for which it is 0.d1..dn x 10^k, and it is
 *     written as ECMAScript's Number::toString writes a double with those
 *     digits: d1..dn and k-n zeros when n <= k <= 21; d1..dk.dk+1..dn when
 *     0 < k <= 21; 0. and -k zeros and d1..dn when -6 < k <= 0; else
 *     d1[.d2..dn]e+X or e-X with X = |k-1|.  So 1, 1.0, 1e0, 10e-1 and
 *     0.1e1 are all "1", 100e-2 and 1.00 too; 1.5e3 is "1500"; 0.000001 is
 *     "0.000001" and 1e-7 "1e-7"; 1e21 is "1e+21".  9007199254740993.0 is
 *     "9007199254740993" and 9007199254740992.0 "9007199254740992": money
 *     amounts never merge.  Integers of up to 21 digits, which includes
 *     every int64, are written as plain digits, as jansson wrote integers.
 *     -0, -0.0 and 0e5 are all "0": they are equal as decimals.  For a
 *     number a double holds exactly in at most 15 significant digits, the
 *     form is what JSON.stringify(JSON.parse(x)) gives.
 *
 * WHAT IS NOT JSON HERE (the body is then hashed raw, docs/protocol.md
 * section 4)
 *   - Anything RFC 8259 refuses: white space other than space, tab, CR and
 *     LF; a byte order mark; single quotes; trailing commas; comments;
 *     numbers such as 01, 1., .5, +1, -, 1e, NaN, Infinity; a raw control
 *     character in a string; an unknown escape; a \u escape of a lone
 *     surrogate; invalid UTF-8 (overlong forms, encoded surrogates, beyond
 *     U+10FFFF, truncated sequences); anything after the top-level value.
 *     Any value may stand at the top.  "\u0000" is an ordinary character.
 *   - An object with two members of one key (after decoding escapes, so
 *     "a" and "\u0061" are one key).  Which member wins is up to each
 *     parser (JSON.parse and most others keep the last, some the first),
 *     so any canonical form would merge payloads that some upstream reads
 *     differently; hashed raw, two such bodies are the same only when
 *     their bytes are.  RFC 8785 (JCS) refuses them too.
 *   - Nesting deeper than IDEM_JSON_MAX_DEPTH arrays and objects.
 *   - A nonzero number whose exponent x, written d.ddd x 10^x, is beyond
 *     +-IDEM__JSON_MAX_EXP (10^18 - 1): its canonical exponent must fit in
 *     an int64.  The digits themselves are not limited (the body is).
 *   - A text of 4 GiB or more (offsets are 32-bit), and the empty text.
 *
 * HOW: ZERO-COPY, TWO SMALL TABLES, STREAMED OUT
 * Nothing of the text is copied and no tree of values is built.  The
 * canonical form is written by walking the text again, so all a document
 * needs beyond the text is what a walk cannot find on its own: the sorted
 * order of the members of every object with two or more (the key offsets,
 * 4 bytes a member, and 16 bytes an object for its '{' and '}' offsets and
 * its slice of members), and the offsets of the values the pointers drop.
 *   1. A counting parse validates everything (with the limits above),
 *      measures the canonical form (the 'J' frame needs its length before
 *      its bytes), counts the objects of two or more members, their members
 *      and the deepest the stack of open members gets, and marks those
 *      objects in a bitmap of one bit per object (len/16 bytes at most,
 *      freed when the parse ends).
 *   2. One allocation of exactly that size holds the tables.  When there is
 *      such an object, a second parse (which checks nothing again) pushes
 *      the key offsets of each object on a stack and, at its '}',
 *      merge-sorts them into the member table (the stack slice is the
 *      scratch buffer) and refuses a duplicate key.  The bitmap lets it
 *      give each object its entry at its '{', so the object table is in
 *      text order and the writer finds an object by binary search.
 *   3. All the pointers are resolved together in one walk of the text,
 *      each to the offset of the value it names, whose canonical bytes
 *      (with its key and a comma) are then taken off the length: a value on
 *      no pointer's way is skipped, an array on some pointer's way is
 *      walked once for all of them, and a sorted object is entered by
 *      binary search.  So no byte is read twice however many pointers
 *      there are.
 *   4. The writer streams the canonical form to the SHA-256 through a
 *      4 KiB buffer.  The canonical text is never held in memory
 *      (idem_json_canonicalize aside, whose caller asks for it).
 * Memory: 16 bytes of table for an object of two or more members, which
 * takes at least 12 bytes of text ({"":0,"a":0}), and 8 for each of its
 * members (4 of them on the stack, which holds the members of the objects
 * open at once), each of which takes 5 at least; objects of 0 or 1
 * members, arrays and scalars cost nothing but their bit.  The most for
 * any text is 2.25 bytes per byte (a binary tree of objects of two members
 * comes nearest; a unit test checks it and the other costly shapes); it is
 * about 0.6 for arrays of records of short fields, and for the 10 MiB body
 * [{},{},...] just the 640 KiB bitmap.  There are two allocations: the
 * bitmap, freed when the parse ends, and the tables, freed with the
 * document.
 * Time: two linear parses (one when no object has two members), one
 * linear walk for the pointers, one linear write, plus the sorting: m log m
 * comparisons of keys for an object of m members, and a binary search per
 * object written.  Recursion is bounded by IDEM_JSON_MAX_DEPTH (well under
 * a hundred bytes of stack a level).
 *
 * JSON pointers (RFC 6901): "/a/b" names member b of member a; "~1" stands
 * for "/" and "~0" for "~" inside a token; a token on an array is an index
 * ("0", "17", no leading zeros; "-" names nothing).  All pointers are looked
 * up in the document as received and then all the values they name are
 * left out, so their order does not matter: ["/a/0", "/a/1"] drops the
 * first two elements of a.  A pointer that names nothing, a malformed one
 * (not starting with "/", a "~" not followed by 0 or 1) and "" (the whole
 * document, which cannot be removed from itself) are skipped; a config
 * loader should reject the malformed ones with idem_json_pointer_valid().
 *
 * INVARIANTS: the canonical form is valid JSON and its own canonical form
 * (a fixed point); after the counting parse accepts a text, every later
 * walk of it reads only bytes the parse checked, so they check nothing.
 *
 * THREADING: reentrant; no global state.
 */
#include "core/json.h"

#include <stdlib.h>
#include <string.h>

#include "idem/alloc.h"
#include "idem/fingerprint.h"
#include "core/utf8.h"

/* The largest exponent literal kept exactly; a larger one saturates here,
 * still far enough beyond IDEM__JSON_MAX_EXP plus any offset a 4 GiB text
 * can add that the number is refused all the same. */
#define EXP_SATURATE INT64_C(4000000000000000000)

/* An object of two or more members. */
struct obj {
    uint32_t open;  /* offset of its '{' */
    uint32_t close; /* offset of its '}' */
    uint32_t first; /* its members in mem[first .. first + n), sorted */
    uint32_t n;
};

struct idem__json {
    const unsigned char *text;
    size_t len;
    size_t root;      /* offset of the top-level value */
    struct obj *objs; /* sorted by open */
    size_t n_objs;
    uint32_t *mem;   /* offsets of members' keys (their opening quote) */
    uint32_t *stack; /* the parse's stack of open members; unused after */
    uint32_t *drop;  /* offsets of the values to leave out, sorted, unique */
    size_t n_drop;
    size_t n_found; /* entries of drop while the pointers are resolved */
    size_t canon_len;
    size_t memory; /* bytes of the one allocation */
};

/* ---- reading the text ------------------------------------------------------ */

static int is_ws(unsigned char c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

static size_t skip_ws(const unsigned char *s, size_t len, size_t i)
{
    while (i < len && is_ws(s[i]))
        i++;
    return i;
}

static int is_digit(unsigned char c)
{
    return c >= '0' && c <= '9';
}

/* The four hex digits at s[i..i+4), or -1. */
static long hex4(const unsigned char *s, size_t len, size_t i)
{
    long v = 0;

    if (len < 4 || i > len - 4)
        return -1;
    for (size_t j = i; j < i + 4; j++) {
        unsigned char c = s[j];
        int d;
        if (c >= '0' && c <= '9')
            d = c - '0';
        else if (c >= 'a' && c <= 'f')
            d = c - 'a' + 10;
        else if (c >= 'A' && c <= 'F')
            d = c - 'A' + 10;
        else
            return -1;
        v = v * 16 + d;
    }
    return v;
}

/* A number as decimal digits: the significant digits are the digit
 * characters from first to last (inclusive, the '.' at dot skipped when it
 * lies between), n of them, and the value is 0.d1..dn x 10^k. */
struct num {
    int neg, zero;
    size_t first, last, dot;
    int64_t n, k;
};

/* Scan the number at s[i] (RFC 8259 grammar).  Returns the offset just past
 * it, or 0 when there is none; the exponent is not checked here. */
static size_t scan_number(const unsigned char *s, size_t len, size_t i, struct num *nm)
{
    int64_t idx = 0, int_digits, sig = -1, x = 0;

    memset(nm, 0, sizeof *nm);
    nm->dot = SIZE_MAX;
    if (i < len && s[i] == '-') {
        nm->neg = 1;
        i++;
    }
    if (i >= len || !is_digit(s[i]))
        return 0;
    if (s[i] == '0') {
        i++;
        idx = 1;
    } else {
        for (; i < len && is_digit(s[i]); i++, idx++) {
            if (s[i] != '0') {
                if (sig < 0) {
                    sig = idx;
                    nm->first = i;
                }
                nm->last = i;
            }
        }
    }
    int_digits = idx;
    if (i < len && s[i] == '.') {
        nm->dot = i++;
        if (i >= len || !is_digit(s[i]))
            return 0;
        for (; i < len && is_digit(s[i]); i++, idx++) {
            if (s[i] != '0') {
                if (sig < 0) {
                    sig = idx;
                    nm->first = i;
                }
                nm->last = i;
            }
        }
    }
    if (i < len && (s[i] == 'e' || s[i] == 'E')) {
        int neg = 0;
        i++;
        if (i < len && (s[i] == '+' || s[i] == '-'))
            neg = s[i++] == '-';
        if (i >= len || !is_digit(s[i]))
            return 0;
        for (; i < len && is_digit(s[i]); i++)
            x = x < EXP_SATURATE / 10 ? x * 10 + (s[i] - '0') : EXP_SATURATE;
        if (neg)
            x = -x;
    }
    if (sig < 0) {
        nm->zero = 1;
        nm->neg = 0;
        return i;
    }
    nm->n = (int64_t)(nm->last - nm->first) + 1;
    if (nm->dot > nm->first && nm->dot < nm->last)
        nm->n--;
    nm->k = x + int_digits - sig;
    return i;
}

/* The code point of the escape at s[i] ('\\'), which the parse checked;
 * returns the offset past it. */
static size_t decode_escape(const unsigned char *s, size_t len, size_t i, uint32_t *cp)
{
    switch (s[i + 1]) {
    case 'b': *cp = '\b'; return i + 2;
    case 'f': *cp = '\f'; return i + 2;
    case 'n': *cp = '\n'; return i + 2;
    case 'r': *cp = '\r'; return i + 2;
    case 't': *cp = '\t'; return i + 2;
    case 'u': break;
    default: *cp = s[i + 1]; return i + 2; /* " \ / */
    }
    *cp = (uint32_t)hex4(s, len, i + 2);
    i += 6;
    if (*cp >= 0xD800 && *cp <= 0xDBFF) {
        uint32_t lo = (uint32_t)hex4(s, len, i + 2);
        *cp = 0x10000 + ((*cp - 0xD800) << 10) + (lo - 0xDC00);
        i += 6;
    }
    return i;
}

static size_t utf8_encode(uint32_t cp, unsigned char *out)
{
    if (cp < 0x80) {
        out[0] = (unsigned char)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (unsigned char)(0xC0 | (cp >> 6));
        out[1] = (unsigned char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (unsigned char)(0xE0 | (cp >> 12));
        out[1] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
        out[2] = (unsigned char)(0x80 | (cp & 0x3F));
        return 3;
    }
    out[0] = (unsigned char)(0xF0 | (cp >> 18));
    out[1] = (unsigned char)(0x80 | ((cp >> 12) & 0x3F));
    out[2] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
    out[3] = (unsigned char)(0x80 | (cp & 0x3F));
    return 4;
}

/* 1 for the bytes a string may hold as they are and that need no more
 * checking: printable ASCII but '"' and '\\'. */
#define R16(v) v, v, v, v, v, v, v, v, v, v, v, v, v, v, v, v
static const unsigned char plain_ascii[256] = {
    R16(0), R16(0),
    1, 1, 0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, /* 0x20: '"' */
    R16(1), R16(1),
    1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 1, 1, 1, /* 0x50: '\\' */
    R16(1), R16(1),
    R16(0), R16(0), R16(0), R16(0), R16(0), R16(0), R16(0), R16(0),
};
#undef R16

/* The offset past the checked string whose opening quote is at s[i]: the
 * first '"' after it that an even number of backslashes precede. */
static size_t skip_string(const unsigned char *s, size_t len, size_t i)
{
    for (i++;;) {
        const unsigned char *q = memchr(s + i, '"', len - i);
        size_t at = (size_t)(q - s), b = at;
        while (s[b - 1] == '\\')
            b--;
        if ((at - b) % 2 == 0)
            return at + 1;
        i = at + 1;
    }
}

/* ---- writing canonical bytes ------------------------------------------------ */

/* Where canonical bytes go: counted only (sink NULL), or gathered in buf
 * and handed to the sink a buffer at a time. */
struct out {
    idem__json_sink_fn sink;
    void *arg;
    int failed;
    size_t total;       /* bytes written so far */
    unsigned char *buf; /* cap bytes, with a sink */
    size_t n, cap;      /* bytes in buf, its size */
};

#define OUT_BUF 4096

static void flush(struct out *o)
{
    if (o->n > 0 && !o->failed && !o->sink(o->arg, o->buf, o->n))
        o->failed = 1;
    o->n = 0;
}

static void put(struct out *o, const void *p, size_t n)
{
    o->total += n;
    if (o->sink == NULL || n == 0)
        return;
    if (n > o->cap - o->n) {
        flush(o);
        if (n >= o->cap) {
            if (!o->failed && !o->sink(o->arg, p, n))
                o->failed = 1;
            return;
        }
    }
    memcpy(o->buf + o->n, p, n);
    o->n += n;
}

static void put_char(struct out *o, char c)
{
    o->total++;
    if (o->sink == NULL)
        return;
    if (o->n == o->cap)
        flush(o);
    o->buf[o->n++] = (unsigned char)c;
}

static void put_code_point(struct out *o, uint32_t cp)
{
    static const char upper_hex[] = "0123456789ABCDEF";
    unsigned char u[6] = {'\\', 'u', '0', '0', 0, 0};

    switch (cp) {
    case '"': put(o, "\\\"", 2); return;
    case '\\': put(o, "\\\\", 2); return;
    case '\b': put(o, "\\b", 2); return;
    case '\f': put(o, "\\f", 2); return;
    case '\n': put(o, "\\n", 2); return;
    case '\r': put(o, "\\r", 2); return;
    case '\t': put(o, "\\t", 2); return;
    default: break;
    }
    if (cp < 0x20) {
        u[4] = (unsigned char)upper_hex[cp >> 4];
        u[5] = (unsigned char)upper_hex[cp & 0xF];
        put(o, u, 6);
        return;
    }
    put(o, u, utf8_encode(cp, u));
}

/* Significant digits [from, to) of nm (0-based). */
static void put_digits(struct out *o, const unsigned char *s, const struct num *nm, int64_t from,
                       int64_t to)
{
    int64_t before_dot =
        nm->dot > nm->first && nm->dot < nm->last ? (int64_t)(nm->dot - nm->first) : nm->n;

    if (from < before_dot) {
        int64_t e = to < before_dot ? to : before_dot;
        put(o, s + nm->first + from, (size_t)(e - from));
        from = e;
    }
    if (from < to)
        put(o, s + nm->first + from + 1, (size_t)(to - from));
}

static void put_zeros(struct out *o, int64_t n)
{
    static const char zeros[] = "00000000000000000000000"; /* n <= 21 here */
    put(o, zeros, (size_t)n);
}

/* The canonical form of the number nm, whose text is in s. */
static void put_number(struct out *o, const unsigned char *s, const struct num *nm)
{
    int64_t n = nm->n, k = nm->k, x;
    char exp[24];
    size_t e = sizeof exp;

    if (nm->zero) {
        put_char(o, '0');
        return;
    }
    if (nm->neg)
        put_char(o, '-');
    if (n <= k && k <= 21) {
        put_digits(o, s, nm, 0, n);
        put_zeros(o, k - n);
    } else if (0 < k && k <= 21) {
        put_digits(o, s, nm, 0, k);
        put_char(o, '.');
        put_digits(o, s, nm, k, n);
    } else if (-6 < k && k <= 0) {
        put(o, "0.", 2);
        put_zeros(o, -k);
        put_digits(o, s, nm, 0, n);
    } else {
        put_digits(o, s, nm, 0, 1);
        if (n > 1) {
            put_char(o, '.');
            put_digits(o, s, nm, 1, n);
        }
        x = k - 1 < 0 ? -(k - 1) : k - 1; /* |x| <= IDEM__JSON_MAX_EXP */
        do {
            exp[--e] = (char)('0' + x % 10);
            x /= 10;
        } while (x > 0);
        exp[--e] = k - 1 < 0 ? '-' : '+';
        exp[--e] = 'e';
        put(o, exp + e, sizeof exp - e);
    }
}

/* ---- the counting and the building parse ---------------------------------- */

struct parse {
    const unsigned char *s;
    size_t len, pos;
    size_t n_objs, n_mem;    /* objects of 2+ members, and their members */
    size_t stack, stack_max; /* open members now, and at the most */
    struct idem__json *doc;  /* the building parse only: its tables */
    size_t stack_cap, objs_done, mem_done;
    struct out canon;     /* counts the canonical form's bytes */
    unsigned char *multi; /* bit t: the t-th object (by '{') has 2+ members */
    size_t multi_len;     /* bytes of multi */
    size_t n_seen;        /* objects begun so far */
};

static int parse_value(struct parse *p, int depth);

static int parse_string(struct parse *p)
{
    const unsigned char *s = p->s;
    size_t i = p->pos + 1, len = p->len, escaped = 0, e;
    uint32_t cp_out;

    if (p->doc != NULL) { /* the building parse: checked and counted before */
        p->pos = skip_string(s, len, p->pos);
        return 0;
    }
    for (;;) {
        unsigned char c;
        /* The common case first: a run of printable ASCII. */
        while (i < len && plain_ascii[s[i]])
            i++;
        if (i >= len)
            return -1;
        c = s[i];
        if (c == '"') {
            /* Everything but the escapes is written as it is. */
            p->canon.total += i + 1 - p->pos - escaped;
            p->pos = i + 1;
            return 0;
        }
        if (c < 0x20)
            return -1;
        if (c >= 0x80) {
            size_t n = idem__utf8_seq(s + i, len - i);
            if (n == 0)
                return -1;
            i += n;
            continue;
        }
        if (i + 1 >= len)
            return -1;
        e = i;
        switch (s[i + 1]) {
        case '"': case '\\': case '/': case 'b': case 'f': case 'n': case 'r': case 't':
            i += 2;
            break;
        case 'u': {
            long cp = hex4(s, len, i + 2);
            if (cp < 0 || (cp >= 0xDC00 && cp <= 0xDFFF))
                return -1;
            i += 6;
            if (cp >= 0xD800 && cp <= 0xDBFF) {
                long lo;
                if (i + 1 >= len || s[i] != '\\' || s[i + 1] != 'u')
                    return -1;
                lo = hex4(s, len, i + 2);
                if (lo < 0xDC00 || lo > 0xDFFF)
                    return -1;
                i += 6;
            }
            break;
        }
        default:
            return -1;
        }
        (void)decode_escape(s, len, e, &cp_out);
        put_code_point(&p->canon, cp_out);
        escaped += i - e;
    }
}

/* Decoded bytes of a checked JSON string, one at a time. */
struct keyit {
    const unsigned char *s;
    size_t len, i;         /* next raw byte */
    unsigned char pend[4]; /* the rest of a decoded escape */
    size_t n_pend, at;
};

static void keyit_init(struct keyit *it, const unsigned char *s, size_t len, size_t quote)
{
    it->s = s;
    it->len = len;
    it->i = quote + 1;
    it->n_pend = it->at = 0;
}

/* The next byte, or -1 at the closing quote. */
static int keyit_next(struct keyit *it)
{
    unsigned char c;
    uint32_t cp;

    if (it->at < it->n_pend)
        return it->pend[it->at++];
    c = it->s[it->i];
    if (c == '"')
        return -1;
    if (c != '\\') {
        it->i++;
        return c;
    }
    it->i = decode_escape(it->s, it->len, it->i, &cp);
    it->n_pend = utf8_encode(cp, it->pend);
    it->at = 1;
    return it->pend[0];
}

/* Compare the decoded keys whose opening quotes are at a and b. */
static int key_cmp(const unsigned char *s, size_t len, size_t a, size_t b)
{
    struct keyit x, y;
    size_t i = a + 1, j = b + 1;
    int cx, cy;

    /* Raw bytes other than '\\' decode to themselves: compare those fast. */
    while (s[i] == s[j] && s[i] != '"' && s[i] != '\\') {
        i++;
        j++;
    }
    if (s[i] != '\\' && s[j] != '\\') {
        if (s[i] == s[j])
            return 0; /* both at the closing quote */
        if (s[i] == '"')
            return -1;
        if (s[j] == '"')
            return 1;
        return s[i] < s[j] ? -1 : 1;
    }
    keyit_init(&x, s, len, i - 1);
    keyit_init(&y, s, len, j - 1);
    do {
        cx = keyit_next(&x);
        cy = keyit_next(&y);
    } while (cx == cy && cx >= 0);
    return cx == cy ? 0 : cx < cy ? -1 : 1;
}

/* Sort the m key offsets in a, with b (m entries) as scratch; returns the
 * array that holds the result (a or b).  Bottom-up merge sort: m log m
 * comparisons at worst, no allocation. */
static uint32_t *sort_keys(const unsigned char *s, size_t len, uint32_t *a, uint32_t *b, size_t m)
{
    uint32_t *src = a, *dst = b, *t;

    for (size_t w = 1; w < m; w *= 2) {
        for (size_t lo = 0; lo < m; lo += 2 * w) {
            size_t mid = lo + w < m ? lo + w : m, hi = lo + 2 * w < m ? lo + 2 * w : m;
            size_t i = lo, j = mid, k = lo;
            while (i < mid && j < hi)
                dst[k++] = key_cmp(s, len, src[j], src[i]) < 0 ? src[j++] : src[i++];
            while (i < mid)
                dst[k++] = src[i++];
            while (j < hi)
                dst[k++] = src[j++];
        }
        t = src;
        src = dst;
        dst = t;
    }
    return src;
}

/* The '}' of the t-th object, whose members are the top entries of the
 * stack from base on; slot is its entry in d->objs (building). */
static int close_object(struct parse *p, size_t t, size_t slot, size_t base)
{
    struct idem__json *d = p->doc;
    size_t m = p->stack - base;
    uint32_t *dst, *sorted;

    p->stack = base;
    if (m < 2)
        return 0;
    if (d == NULL) {
        p->n_objs++;
        p->n_mem += m;
        p->multi[t / 8] |= (unsigned char)(1u << (t % 8));
        return 0;
    }
    if (slot == SIZE_MAX || m > p->n_mem - p->mem_done)
        return -1; /* cannot happen: the counting parse saw the same text */
    dst = d->mem + p->mem_done;
    sorted = sort_keys(p->s, p->len, d->stack + base, dst, m);
    if (sorted != dst)
        memcpy(dst, sorted, m * sizeof *dst);
    for (size_t i = 1; i < m; i++)
        if (key_cmp(p->s, p->len, dst[i - 1], dst[i]) == 0)
            return -1; /* a duplicate key */
    d->objs[slot].close = (uint32_t)(p->pos - 1);
    d->objs[slot].first = (uint32_t)p->mem_done;
    d->objs[slot].n = (uint32_t)m;
    p->mem_done += m;
    return 0;
}

static int parse_object(struct parse *p, int depth)
{
    size_t base = p->stack, t = p->n_seen++, slot = SIZE_MAX;

    if (depth > IDEM_JSON_MAX_DEPTH || t / 8 >= p->multi_len)
        return -1; /* the bitmap has room for every object there can be */
    /* The building parse gives the objects of two or more members their
     * entries in the order they begin, so d->objs is sorted by '{'. */
    if (p->doc != NULL && (p->multi[t / 8] >> (t % 8) & 1)) {
        if (p->objs_done >= p->doc->n_objs)
            return -1; /* cannot happen, as below */
        slot = p->objs_done++;
        p->doc->objs[slot].open = (uint32_t)p->pos;
    }
    p->canon.total += 2; /* { } */
    p->pos = skip_ws(p->s, p->len, p->pos + 1);
    if (p->pos < p->len && p->s[p->pos] == '}') {
        p->pos++;
        return 0;
    }
    for (;;) {
        if (p->pos >= p->len || p->s[p->pos] != '"')
            return -1;
        if (p->doc != NULL) {
            if (p->stack >= p->stack_cap)
                return -1; /* cannot happen, as above */
            p->doc->stack[p->stack] = (uint32_t)p->pos;
        }
        if (++p->stack > p->stack_max)
            p->stack_max = p->stack;
        if (parse_string(p) != 0)
            return -1;
        p->pos = skip_ws(p->s, p->len, p->pos);
        if (p->pos >= p->len || p->s[p->pos] != ':')
            return -1;
        p->canon.total++;
        p->pos = skip_ws(p->s, p->len, p->pos + 1);
        if (parse_value(p, depth) != 0)
            return -1;
        p->pos = skip_ws(p->s, p->len, p->pos);
        if (p->pos >= p->len)
            return -1;
        if (p->s[p->pos] == '}') {
            p->pos++;
            return close_object(p, t, slot, base);
        }
        if (p->s[p->pos] != ',')
            return -1;
        p->canon.total++;
        p->pos = skip_ws(p->s, p->len, p->pos + 1);
    }
}

static int parse_array(struct parse *p, int depth)
{
    if (depth > IDEM_JSON_MAX_DEPTH)
        return -1;
    p->canon.total += 2; /* [ ] */
    p->pos = skip_ws(p->s, p->len, p->pos + 1);
    if (p->pos < p->len && p->s[p->pos] == ']') {
        p->pos++;
        return 0;
    }
    for (;;) {
        if (parse_value(p, depth) != 0)
            return -1;
        p->pos = skip_ws(p->s, p->len, p->pos);
        if (p->pos >= p->len)
            return -1;
        if (p->s[p->pos] == ']') {
            p->pos++;
            return 0;
        }
        if (p->s[p->pos] != ',')
            return -1;
        p->canon.total++;
        p->pos = skip_ws(p->s, p->len, p->pos + 1);
    }
}

static int parse_literal(struct parse *p, const char *word, size_t n)
{
    if (p->len - p->pos < n || memcmp(p->s + p->pos, word, n) != 0)
        return -1;
    p->pos += n;
    p->canon.total += n;
    return 0;
}

/* depth: how many arrays and objects enclose the value. */
static int parse_value(struct parse *p, int depth)
{
    struct num nm;
    size_t end;

    if (p->pos >= p->len)
        return -1;
    switch (p->s[p->pos]) {
    case '{': return parse_object(p, depth + 1);
    case '[': return parse_array(p, depth + 1);
    case '"': return parse_string(p);
    case 't': return parse_literal(p, "true", 4);
    case 'f': return parse_literal(p, "false", 5);
    case 'n': return parse_literal(p, "null", 4);
    default: break;
    }
    end = scan_number(p->s, p->len, p->pos, &nm);
    if (end == 0)
        return -1;
    if (!nm.zero && (nm.k - 1 > IDEM__JSON_MAX_EXP || nm.k - 1 < -IDEM__JSON_MAX_EXP))
        return -1;
    put_number(&p->canon, p->s, &nm);
    p->pos = end;
    return 0;
}

/* The whole text: one value with white space around it. */
static int parse_text(struct parse *p, size_t *root)
{
    p->pos = skip_ws(p->s, p->len, 0);
    *root = p->pos;
    if (parse_value(p, 0) != 0)
        return -1;
    return skip_ws(p->s, p->len, p->pos) == p->len ? 0 : -1;
}

/* ---- finding things in a parsed document ---------------------------------- */

static const struct obj *find_obj(const struct idem__json *d, size_t open)
{
    size_t lo = 0, hi = d->n_objs;

    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (d->objs[mid].open == open)
            return &d->objs[mid];
        if (d->objs[mid].open < open)
            lo = mid + 1;
        else
            hi = mid;
    }
    return NULL;
}

/* The offset past the checked value at i. */
static size_t skip_value(const struct idem__json *d, size_t i)
{
    const unsigned char *s = d->text;
    const struct obj *o;
    struct num nm;
    size_t depth = 0;

    switch (s[i]) {
    case '"': return skip_string(s, d->len, i);
    case 't': case 'n': return i + 4;
    case 'f': return i + 5;
    case '{':
        if ((o = find_obj(d, i)) != NULL)
            return (size_t)o->close + 1;
        /* fall through */
    case '[':
        for (;;) {
            unsigned char c = s[i];
            if (c == '"') {
                i = skip_string(s, d->len, i);
                continue;
            }
            if (c == '[' || c == '{')
                depth++;
            else if ((c == ']' || c == '}') && --depth == 0)
                return i + 1;
            i++;
        }
    default:
        return scan_number(s, d->len, i, &nm);
    }
}

/* The offset of the value of the member whose key is at koff. */
static size_t member_value(const struct idem__json *d, size_t koff)
{
    size_t i = skip_ws(d->text, d->len, skip_string(d->text, d->len, koff));
    return skip_ws(d->text, d->len, i + 1);
}

/* A pointer being resolved: its token at the level of the walk. */
struct ptr {
    const char *tok, *end; /* the token, ~0 and ~1 still escaped */
    size_t at;             /* the index it names, then the offset of the value */
    size_t key;            /* the offset of the value's key; SIZE_MAX in an array */
};

static const char *token_end(const char *t)
{
    const char *e = strchr(t, '/');
    return e != NULL ? e : t + strlen(t);
}

static int by_at(const void *a, const void *b)
{
    const struct ptr *x = a, *y = b;
    return x->at < y->at ? -1 : x->at > y->at;
}

/* Compare the decoded key at koff with the pointer token [t, end), ~0 and
 * ~1 unescaped. */
static int key_token_cmp(const struct idem__json *d, size_t koff, const char *t, const char *end)
{
    struct keyit it;
    int ck, ct;

    keyit_init(&it, d->text, d->len, koff);
    do {
        ck = keyit_next(&it);
        if (t == end) {
            ct = -1;
        } else if (*t == '~') {
            ct = t[1] == '0' ? '~' : '/';
            t += 2;
        } else {
            ct = (unsigned char)*t++;
        }
    } while (ck == ct && ck >= 0);
    return ck == ct ? 0 : ck < ct ? -1 : 1;
}

static size_t walk(struct idem__json *d, size_t i, struct ptr *p, size_t n);
static size_t emit_value(const struct idem__json *d, struct out *o, size_t i);
static size_t emit_string(const struct idem__json *d, struct out *o, size_t i);

/* The commas a container of c values loses when r of them are dropped. */
static size_t commas_lost(size_t c, size_t r)
{
    return r == 0 ? 0 : r < c ? r : c - 1;
}

/* The pointers p[0..n) have named the value at v (with its key at key, or
 * SIZE_MAX): when one of them ends there, v is dropped (once, and what it
 * would have written is taken off the canonical length, ++*n_dropped);
 * otherwise they go on into it.  Returns the offset past v. */
static size_t descend(struct idem__json *d, size_t v, size_t key, struct ptr *p, size_t n,
                      size_t *n_dropped)
{
    size_t going = 0, end;
    int drop = 0;

    for (size_t r = 0; r < n; r++) {
        if (*p[r].end == '\0') {
            drop = 1;
        } else {
            p[going].tok = p[r].end + 1;
            p[going].end = token_end(p[going].tok);
            going++;
        }
    }
    if (!drop)
        return walk(d, v, p, going);
    /* Nothing inside v is dropped on its own (the walk stops here), so
     * counting it as the writer would write it is exact. */
    struct out count = {0};
    d->drop[d->n_found++] = (uint32_t)v;
    if (key != SIZE_MAX) {
        (void)emit_string(d, &count, key);
        count.total++; /* : */
    }
    end = emit_value(d, &count, v);
    d->canon_len -= count.total;
    ++*n_dropped;
    return end;
}

/* In p[0..n), sorted by at: the run of pointers from *k on that name one
 * value, handed on; *k moves past it. */
static size_t runs(struct idem__json *d, struct ptr *p, size_t n, size_t *k, size_t *n_dropped)
{
    size_t r = *k, at = p[r].at;

    while (r < n && p[r].at == at)
        r++;
    at = descend(d, at, p[*k].key, p + *k, r - *k, n_dropped);
    *k = r;
    return at;
}

static size_t walk_object(struct idem__json *d, size_t i, struct ptr *p, size_t n)
{
    const struct obj *o = find_obj(d, i);
    size_t k = 0, going = 0, end, n_dropped = 0;

    if (o != NULL) {
        for (size_t r = 0; r < n; r++) {
            size_t lo = 0, hi = o->n;
            p[r].at = SIZE_MAX;
            while (lo < hi) {
                size_t mid = lo + (hi - lo) / 2;
                int c = key_token_cmp(d, d->mem[o->first + mid], p[r].tok, p[r].end);
                if (c == 0) {
                    p[r].key = d->mem[o->first + mid];
                    p[r].at = member_value(d, p[r].key);
                    break;
                }
                if (c < 0)
                    lo = mid + 1;
                else
                    hi = mid;
            }
        }
        qsort(p, n, sizeof *p, by_at);
        while (k < n && p[k].at != SIZE_MAX)
            (void)runs(d, p, n, &k, &n_dropped);
        d->canon_len -= commas_lost(o->n, n_dropped);
        return (size_t)o->close + 1;
    }
    /* No more than one member. */
    i = skip_ws(d->text, d->len, i + 1);
    if (d->text[i] == '}')
        return i + 1;
    for (size_t r = 0; r < n; r++) {
        if (key_token_cmp(d, i, p[r].tok, p[r].end) == 0) {
            struct ptr t = p[going];
            p[going++] = p[r];
            p[r] = t;
        }
    }
    end = descend(d, member_value(d, i), i, p, going, &n_dropped);
    return skip_ws(d->text, d->len, end) + 1;
}

/* An array index token: "0" or digits without a leading zero. */
static size_t token_index(const char *t, const char *end)
{
    size_t index = 0;

    if (t == end || (end - t > 1 && *t == '0'))
        return SIZE_MAX;
    for (; t < end; t++) {
        if (*t < '0' || *t > '9' || index > (SIZE_MAX - 10) / 10)
            return SIZE_MAX;
        index = index * 10 + (size_t)(*t - '0');
    }
    return index;
}

static size_t walk_array(struct idem__json *d, size_t i, struct ptr *p, size_t n)
{
    const unsigned char *s = d->text;
    size_t k = 0, j, n_dropped = 0;

    for (size_t r = 0; r < n; r++) {
        p[r].at = token_index(p[r].tok, p[r].end);
        p[r].key = SIZE_MAX;
    }
    qsort(p, n, sizeof *p, by_at);
    i = skip_ws(s, d->len, i + 1);
    if (s[i] == ']')
        return i + 1;
    for (j = 1;; j++) {
        size_t end;
        if (k < n && p[k].at == j - 1) {
            size_t r = k;
            while (r < n && p[r].at == j - 1)
                r++;
            end = descend(d, i, SIZE_MAX, p + k, r - k, &n_dropped);
            k = r;
        } else {
            end = skip_value(d, i);
        }
        i = skip_ws(s, d->len, end);
        if (s[i] == ']') {
            d->canon_len -= commas_lost(j, n_dropped); /* j values */
            return i + 1;
        }
        i = skip_ws(s, d->len, i + 1);
    }
}

/* Resolve the pointers p[0..n), whose tokens are at the level of the value
 * at i, recording the values they name in d->drop.  Returns the offset
 * past the value.  Every byte of the text is read at most once by a walk,
 * however many pointers there are: a value on no pointer's way is skipped,
 * one on some pointer's way is walked, and an object of two or more
 * members is entered by binary search and left by its '}' offset. */
static size_t walk(struct idem__json *d, size_t i, struct ptr *p, size_t n)
{
    if (n > 0 && d->text[i] == '{')
        return walk_object(d, i, p, n);
    if (n > 0 && d->text[i] == '[')
        return walk_array(d, i, p, n);
    return skip_value(d, i); /* a scalar has nothing inside to name */
}

static int dropped(const struct idem__json *d, size_t at)
{
    size_t lo = 0, hi = d->n_drop;

    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (d->drop[mid] == at)
            return 1;
        if (d->drop[mid] < at)
            lo = mid + 1;
        else
            hi = mid;
    }
    return 0;
}

/* ---- writing the canonical form -------------------------------------------- */

/* A checked string: runs without escapes go out as they are (they are
 * valid UTF-8 with nothing to escape), escapes in their canonical form. */
static size_t emit_string(const struct idem__json *d, struct out *o, size_t i)
{
    const unsigned char *s = d->text;
    size_t run = ++i;

    put_char(o, '"');
    for (;;) {
        uint32_t cp;
        while (s[i] != '"' && s[i] != '\\') /* checked: a '"' comes */
            i++;
        put(o, s + run, i - run);
        if (s[i] == '"')
            break;
        i = decode_escape(s, d->len, i, &cp);
        put_code_point(o, cp);
        run = i;
    }
    put_char(o, '"');
    return i + 1;
}

static size_t emit_number(const struct idem__json *d, struct out *o, size_t i)
{
    struct num nm;
    size_t end = scan_number(d->text, d->len, i, &nm);

    put_number(o, d->text, &nm);
    return end;
}

static size_t emit_value(const struct idem__json *d, struct out *o, size_t i);

/* The member at koff, unless the pointers drop it; *first says whether
 * none was written before in this object.  Returns the offset past its
 * value. */
static size_t emit_member(const struct idem__json *d, struct out *o, size_t koff, int *first)
{
    size_t v = member_value(d, koff);

    if (dropped(d, v))
        return skip_value(d, v);
    if (!*first)
        put_char(o, ',');
    *first = 0;
    emit_string(d, o, koff);
    put_char(o, ':');
    return emit_value(d, o, v);
}

static size_t emit_object(const struct idem__json *d, struct out *o, size_t i)
{
    const struct obj *ob = find_obj(d, i);
    int first = 1;

    put_char(o, '{');
    if (ob != NULL) {
        for (uint32_t m = 0; m < ob->n; m++)
            (void)emit_member(d, o, d->mem[ob->first + m], &first);
        put_char(o, '}');
        return (size_t)ob->close + 1;
    }
    /* No more than one member: in place. */
    i = skip_ws(d->text, d->len, i + 1);
    if (d->text[i] == '"')
        i = skip_ws(d->text, d->len, emit_member(d, o, i, &first));
    put_char(o, '}');
    return i + 1;
}

static size_t emit_array(const struct idem__json *d, struct out *o, size_t i)
{
    const unsigned char *s = d->text;
    int first = 1;

    put_char(o, '[');
    i = skip_ws(s, d->len, i + 1);
    if (s[i] != ']') {
        for (;;) {
            if (dropped(d, i)) {
                i = skip_value(d, i);
            } else {
                if (!first)
                    put_char(o, ',');
                first = 0;
                i = emit_value(d, o, i);
            }
            i = skip_ws(s, d->len, i);
            if (s[i] == ']')
                break;
            i = skip_ws(s, d->len, i + 1);
        }
    }
    put_char(o, ']');
    return i + 1;
}

/* Write the checked value at i; returns the offset past it. */
static size_t emit_value(const struct idem__json *d, struct out *o, size_t i)
{
    switch (d->text[i]) {
    case '{': return emit_object(d, o, i);
    case '[': return emit_array(d, o, i);
    case '"': return emit_string(d, o, i);
    case 't': put(o, "true", 4); return i + 4;
    case 'f': put(o, "false", 5); return i + 5;
    case 'n': put(o, "null", 4); return i + 4;
    default: return emit_number(d, o, i);
    }
}

/* ---- the document ----------------------------------------------------------- */

static int by_offset(const void *a, const void *b)
{
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return x < y ? -1 : x > y;
}

/* *size += n * each, or 0 when it would not fit in a size_t. */
static int grow(size_t *size, size_t n, size_t each)
{
    if (n > (SIZE_MAX - *size) / each)
        return 0;
    *size += n * each;
    return 1;
}

idem_err_t idem__json_parse(const char *text, size_t len, const char *const *ignore,
                            size_t n_ignore, idem__json_t **out)
{
    struct parse count = {0}, build = {0};
    struct idem__json *d;
    struct ptr *ptrs;
    size_t size = sizeof *d, root, n_ptrs = 0;
    unsigned char *at, *multi;

    *out = NULL;
    if (text == NULL || len == 0 || len > IDEM__JSON_MAX_LEN)
        return IDEM_E_INVAL;
    /* A bit for every object there can be: each takes two bytes at least. */
    multi = idem_calloc(len / 16 + 1, 1);
    if (multi == NULL)
        return IDEM_E_NOMEM;
    count.s = (const unsigned char *)text;
    count.len = len;
    count.multi = multi;
    count.multi_len = len / 16 + 1;
    if (parse_text(&count, &root) != 0) {
        idem_free(multi);
        return IDEM_E_INVAL;
    }

    d = NULL;
    if (grow(&size, count.n_objs, sizeof(struct obj)) &&
        grow(&size, count.n_mem + count.stack_max, sizeof(uint32_t)) &&
        grow(&size, n_ignore, sizeof(uint32_t) + sizeof(struct ptr)))
        d = idem_malloc(size);
    if (d == NULL) {
        idem_free(multi);
        return IDEM_E_NOMEM;
    }
    memset(d, 0, sizeof *d);
    at = (unsigned char *)(d + 1);
    ptrs = (struct ptr *)(void *)at; /* pointer-aligned, right after *d */
    at += n_ignore * sizeof(struct ptr);
    d->objs = (struct obj *)(void *)at;
    at += count.n_objs * sizeof(struct obj);
    d->mem = (uint32_t *)(void *)at;
    d->stack = d->mem + count.n_mem;
    d->drop = d->stack + count.stack_max;
    d->text = count.s;
    d->len = len;
    d->root = root;
    d->n_objs = count.n_objs;
    d->memory = size + len / 16 + 1;

    /* Without an object of two members there is nothing to sort and no
     * duplicate key: the second parse would find nothing. */
    if (d->n_objs > 0) {
        build.s = count.s;
        build.len = len;
        build.doc = d;
        build.multi = multi;
        build.multi_len = count.multi_len;
        build.stack_cap = count.stack_max;
        build.n_mem = count.n_mem;
        if (parse_text(&build, &root) != 0 || build.objs_done != d->n_objs ||
            build.mem_done != count.n_mem) {
            idem_free(multi);
            idem_free(d);
            return IDEM_E_INVAL; /* a duplicate key */
        }
    }
    idem_free(multi);

    for (size_t i = 0; i < n_ignore; i++) {
        if (!idem_json_pointer_valid(ignore[i]) || ignore[i][0] == '\0')
            continue;
        ptrs[n_ptrs].tok = ignore[i] + 1;
        ptrs[n_ptrs].end = token_end(ptrs[n_ptrs].tok);
        n_ptrs++;
    }
    /* The writer reads d->drop only once it is complete and sorted. */
    d->canon_len = count.canon.total;
    if (n_ptrs > 0)
        (void)walk(d, d->root, ptrs, n_ptrs);
    d->n_drop = d->n_found;
    qsort(d->drop, d->n_drop, sizeof *d->drop, by_offset);
    *out = d;
    return IDEM_OK;
}

size_t idem__json_canonical_len(const idem__json_t *doc)
{
    return doc->canon_len;
}

size_t idem__json_memory(const idem__json_t *doc)
{
    return doc->memory;
}

int idem__json_emit(const idem__json_t *doc, idem__json_sink_fn sink, void *arg)
{
    unsigned char buf[OUT_BUF];
    struct out o = {.sink = sink, .arg = arg, .buf = buf, .cap = sizeof buf};

    (void)emit_value(doc, &o, doc->root);
    flush(&o);
    return !o.failed;
}

void idem__json_destroy(idem__json_t *doc)
{
    idem_free(doc);
}

/* ---- looking one value up (idemd's key_from: json:) ------------------------ */

/* The offset of the value the token [t, end) names in the object at i, or
 * SIZE_MAX.  An object of two or more members is searched in its sorted
 * table; one of fewer has no table and is read directly. */
static size_t object_member(const struct idem__json *d, size_t i, const char *t, const char *end)
{
    const struct obj *o = find_obj(d, i);

    if (o != NULL) {
        size_t lo = 0, hi = o->n;
        while (lo < hi) {
            size_t mid = lo + (hi - lo) / 2;
            int c = key_token_cmp(d, d->mem[o->first + mid], t, end);
            if (c == 0)
                return member_value(d, d->mem[o->first + mid]);
            if (c < 0)
                lo = mid + 1;
            else
                hi = mid;
        }
        return SIZE_MAX;
    }
    i = skip_ws(d->text, d->len, i + 1);
    if (d->text[i] == '}' || key_token_cmp(d, i, t, end) != 0)
        return SIZE_MAX;
    return member_value(d, i);
}

/* The offset of element [t, end) (an index) of the array at i, or SIZE_MAX. */
static size_t array_element(const struct idem__json *d, size_t i, const char *t, const char *end)
{
    size_t want = token_index(t, end);

    if (want == SIZE_MAX)
        return SIZE_MAX;
    i = skip_ws(d->text, d->len, i + 1);
    if (d->text[i] == ']')
        return SIZE_MAX;
    for (size_t j = 0;; j++) {
        if (j == want)
            return i;
        i = skip_ws(d->text, d->len, skip_value(d, i));
        if (d->text[i] == ']')
            return SIZE_MAX;
        i = skip_ws(d->text, d->len, i + 1);
    }
}

idem__json_type_t idem__json_find(const idem__json_t *doc, const char *pointer, size_t *off,
                                  size_t *len)
{
    size_t i;

    *off = 0;
    *len = 0;
    if (doc == NULL || !idem_json_pointer_valid(pointer))
        return IDEM__JSON_NONE;
    i = doc->root;
    while (*pointer != '\0') {
        const char *t = pointer + 1, *end = token_end(t);
        if (doc->text[i] == '{')
            i = object_member(doc, i, t, end);
        else if (doc->text[i] == '[')
            i = array_element(doc, i, t, end);
        else
            i = SIZE_MAX; /* a scalar has nothing inside to name */
        if (i == SIZE_MAX)
            return IDEM__JSON_NONE;
        pointer = end;
    }
    *off = i;
    *len = skip_value(doc, i) - i;
    switch (doc->text[i]) {
    case '"': return IDEM__JSON_STRING;
    case '{': return IDEM__JSON_OBJECT;
    case '[': return IDEM__JSON_ARRAY;
    case 't': return IDEM__JSON_TRUE;
    case 'f': return IDEM__JSON_FALSE;
    case 'n': return IDEM__JSON_NULL;
    default: return IDEM__JSON_NUMBER;
    }
}

/* ---- the public face (include/idem/fingerprint.h) ---------------------------- */

int idem_json_pointer_valid(const char *ptr)
{
    if (ptr == NULL)
        return 0;
    if (*ptr == '\0')
        return 1;
    if (*ptr != '/')
        return 0;
    for (; *ptr != '\0'; ptr++)
        if (*ptr == '~' && ptr[1] != '0' && ptr[1] != '1')
            return 0;
    return 1;
}

struct copy {
    char *dst;
    size_t n, cap;
};

static int copy_sink(void *arg, const void *data, size_t len)
{
    struct copy *c = arg;

    if (len > c->cap - c->n)
        return 0;
    memcpy(c->dst + c->n, data, len);
    c->n += len;
    return 1;
}

idem_err_t idem_json_canonicalize(const char *text, size_t len, const char *const *ignore,
                                  size_t n_ignore, char **out, size_t *out_len)
{
    idem__json_t *doc;
    struct copy c;
    idem_err_t err;

    if (out != NULL)
        *out = NULL;
    if (out_len != NULL)
        *out_len = 0;
    if (out == NULL || out_len == NULL || (text == NULL && len > 0) ||
        (ignore == NULL && n_ignore > 0))
        return IDEM_E_INVAL;
    err = idem__json_parse(text, len, ignore, n_ignore, &doc);
    if (err != IDEM_OK)
        return err;
    c.cap = idem__json_canonical_len(doc);
    c.n = 0;
    c.dst = c.cap < SIZE_MAX ? idem_malloc(c.cap + 1) : NULL;
    if (c.dst == NULL) {
        idem__json_destroy(doc);
        return IDEM_E_NOMEM;
    }
    if (!idem__json_emit(doc, copy_sink, &c) || c.n != c.cap) {
        idem__json_destroy(doc); /* cannot happen: the length was measured */
        idem_free(c.dst);
        return IDEM_E_NOMEM;
    }
    idem__json_destroy(doc);
    c.dst[c.n] = '\0';
    *out = c.dst;
    *out_len = c.n;
    return IDEM_OK;
}

/* ---- reading values (json.h) ------------------------------------------------ */

size_t idem__json_root(const idem__json_t *doc)
{
    return doc->root;
}

idem__json_type_t idem__json_type(const idem__json_t *doc, size_t at)
{
    switch (doc->text[at]) {
    case '{': return IDEM__JSON_OBJECT;
    case '[': return IDEM__JSON_ARRAY;
    case '"': return IDEM__JSON_STRING;
    case 't': return IDEM__JSON_TRUE;
    case 'f': return IDEM__JSON_FALSE;
    case 'n': return IDEM__JSON_NULL;
    default: return IDEM__JSON_NUMBER;
    }
}

/* Compare the decoded key at koff with the plain bytes key[0..klen). */
static int key_plain_cmp(const struct idem__json *d, size_t koff, const char *key, size_t klen)
{
    struct keyit it;
    size_t j = 0;
    int ck, ct;

    keyit_init(&it, d->text, d->len, koff);
    do {
        ck = keyit_next(&it);
        ct = j < klen ? (unsigned char)key[j++] : -1;
    } while (ck == ct && ck >= 0);
    return ck == ct ? 0 : ck < ct ? -1 : 1;
}

int idem__json_member(const idem__json_t *doc, size_t obj, const char *key, size_t klen,
                      size_t *val)
{
    const unsigned char *s = doc->text;
    const struct obj *o;

    if (s[obj] != '{')
        return -1;
    if ((o = find_obj(doc, obj)) != NULL) {
        size_t lo = 0, hi = o->n; /* sorted: binary search */
        while (lo < hi) {
            size_t mid = lo + (hi - lo) / 2;
            int c = key_plain_cmp(doc, doc->mem[o->first + mid], key, klen);
            if (c == 0) {
                *val = member_value(doc, doc->mem[o->first + mid]);
                return 0;
            }
            if (c < 0)
                lo = mid + 1;
            else
                hi = mid;
        }
        return -1;
    }
    /* No entry: the object has no member or one. */
    size_t i = skip_ws(s, doc->len, obj + 1);
    if (s[i] != '"' || key_plain_cmp(doc, i, key, klen) != 0)
        return -1;
    *val = member_value(doc, i);
    return 0;
}

int idem__json_next(const idem__json_t *doc, size_t arr, size_t *cursor, size_t *val)
{
    const unsigned char *s = doc->text;
    size_t i;

    if (s[arr] != '[')
        return -1;
    if (*cursor == 0) {
        i = skip_ws(s, doc->len, arr + 1);
    } else {
        i = skip_ws(s, doc->len, skip_value(doc, *cursor));
        if (s[i] != ',')
            return -1; /* ']' */
        i = skip_ws(s, doc->len, i + 1);
    }
    if (s[i] == ']')
        return -1;
    *cursor = i;
    *val = i;
    return 0;
}

idem_err_t idem__json_string(const idem__json_t *doc, size_t at, char *buf, size_t cap,
                             size_t *len)
{
    struct keyit it;
    size_t n = 0;
    int c;

    *len = 0;
    if (doc->text[at] != '"')
        return IDEM_E_INVAL;
    keyit_init(&it, doc->text, doc->len, at);
    while ((c = keyit_next(&it)) >= 0) {
        if (n >= cap)
            return IDEM_E_TOOBIG;
        buf[n++] = (char)c;
    }
    if (n < cap)
        buf[n] = '\0';
    *len = n;
    return IDEM_OK;
}

/* The digits of the number at at, to its '.', 'e' or end, as an int64. */
static int int_part(const struct idem__json *d, size_t at, int64_t *v, size_t *end)
{
    const unsigned char *s = d->text;
    size_t i = at;
    int neg = 0;
    uint64_t m = 0, lim;

    if (s[i] == '-') {
        neg = 1;
        i++;
    }
    lim = neg ? (uint64_t)INT64_MAX + 1 : (uint64_t)INT64_MAX;
    if (i >= d->len || !is_digit(s[i]))
        return -1;
    for (; i < d->len && is_digit(s[i]); i++) {
        unsigned dg = (unsigned)(s[i] - '0');
        if (m > (lim - dg) / 10)
            return -1;
        m = m * 10 + dg;
    }
    *v = neg ? (m == (uint64_t)INT64_MAX + 1 ? INT64_MIN : -(int64_t)m) : (int64_t)m;
    *end = i;
    return 0;
}

int idem__json_int(const idem__json_t *doc, size_t at, int64_t *v, const char **text,
                   size_t *tlen)
{
    size_t end;

    if (idem__json_type(doc, at) != IDEM__JSON_NUMBER || int_part(doc, at, v, &end) != 0)
        return -1;
    if (end < doc->len && (doc->text[end] == '.' || doc->text[end] == 'e' ||
                           doc->text[end] == 'E'))
        return -1;
    *text = (const char *)doc->text + at;
    *tlen = end - at;
    return 0;
}

int idem__json_int_trunc(const idem__json_t *doc, size_t at, int64_t *v)
{
    size_t end;

    if (idem__json_type(doc, at) != IDEM__JSON_NUMBER || int_part(doc, at, v, &end) != 0)
        return -1;
    if (end < doc->len && doc->text[end] == '.')
        for (end++; end < doc->len && is_digit(doc->text[end]); end++)
            ;
    if (end < doc->len && (doc->text[end] == 'e' || doc->text[end] == 'E'))
        return -1;
    return 0;
}
