/* src/gateway/rbuf.h - input read from a socket and not yet parsed (a
 * client's or an upstream's), in the shape libuv's read callbacks want.
 *
 * The buffer grows by a chunk when less than a quarter chunk is free; what
 * the parser has taken is dropped from the front.  The caller bounds it:
 * the parsers refuse a head or a body past their limits long before memory
 * runs out, and conn.c stops reading a busy connection past RBUF_PAUSE.
 */
#ifndef IDEM_GATEWAY_RBUF_H
#define IDEM_GATEWAY_RBUF_H

#include <string.h>
#include <uv.h>

#include "idem/alloc.h"

typedef struct idem_rbuf {
    char *data;
    size_t len; /* bytes held */
    size_t cap; /* bytes allocated */
} idem_rbuf_t;

/** libuv's alloc callback body: room for the next read, growing by chunk
 * when less than a quarter chunk is free.  buf is empty when out of memory
 * (libuv then reports UV_ENOBUFS). */
static inline void idem_rbuf_alloc(idem_rbuf_t *b, size_t chunk, uv_buf_t *buf)
{
    if (b->cap - b->len < chunk / 4) {
        char *n = idem_realloc(b->data, b->len + chunk);
        if (!n) {
            *buf = uv_buf_init(NULL, 0);
            return;
        }
        b->data = n;
        b->cap = b->len + chunk;
    }
    *buf = uv_buf_init(b->data + b->len, (unsigned)(b->cap - b->len));
}

/** Drop the first n bytes (parsed). */
static inline void idem_rbuf_consume(idem_rbuf_t *b, size_t n)
{
    memmove(b->data, b->data + n, b->len - n);
    b->len -= n;
}

/** Free what b holds; b is empty and may be used again. */
static inline void idem_rbuf_cleanup(idem_rbuf_t *b)
{
    idem_free(b->data);
    b->data = NULL;
    b->len = b->cap = 0;
}

#endif /* IDEM_GATEWAY_RBUF_H */
