/* tests/unit/net_fixture.h - loopback sockets, threaded test servers and
 * loop helpers shared by the unit tests that talk over real sockets
 * (test_upstream, test_request, test_conn).
 *
 * A tnet_server_t listens on 127.0.0.1:<a free port>; a thread accepts and
 * hands each connection to a thread of its own running the test's serve
 * function, which owns the socket (closes it).  tnet_read_request reads one
 * HTTP/1.1 request (head, then Content-Length bytes of body) from any
 * source, so a plain and a TLS test upstream read alike.  TNET_RUN_UNTIL
 * turns a loop until a condition, with a deadline that only bounds a hang.
 * Linked into the tests that use it by tests/unit/meson.build.
 */
#ifndef IDEM_TESTS_NET_FIXTURE_H
#define IDEM_TESTS_NET_FIXTURE_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <uv.h>

#define TNET_MAX_CONNS 64

/* Serve one accepted connection fd (the index-th, from 0); owns fd. */
typedef void (*tnet_serve_fn)(void *ctx, int fd, int index);

typedef struct {
    int lfd;
    int port;
    tnet_serve_fn serve;
    void *ctx;
    atomic_int accepts;
    atomic_int n_conns;
    atomic_bool stopping;
    pthread_t acceptor;
    pthread_t conns[TNET_MAX_CONNS];
} tnet_server_t;

/* A TCP socket bound to 127.0.0.1 on a free port (*port), not listening:
 * a connect to it is refused, and no one else takes the port meanwhile. */
int tnet_bind_loopback(int *port);

/* A socket listening on 127.0.0.1 on a free port (*port). */
int tnet_listen_loopback(int backlog, int *port);

/* Listen, and serve each connection with serve(ctx, fd, index) on a thread
 * of its own; connections past TNET_MAX_CONNS are closed at once. */
void tnet_server_start(tnet_server_t *s, tnet_serve_fn serve, void *ctx);

/* Once the client has closed every connection: stop accepting and join
 * every thread. */
void tnet_server_stop(tnet_server_t *s);

/* Read at most cap bytes into buf: > 0 bytes read, <= 0 the end. */
typedef ssize_t (*tnet_read_fn)(void *src, char *buf, size_t cap);

/* One request (head, then Content-Length bytes of body) from src into buf,
 * NUL-terminated.  @return its length, or 0 at the end, an error, or a
 * request that does not fit. */
size_t tnet_read_request_from(tnet_read_fn rd, void *src, char *buf, size_t cap);

/* The same from the socket (or pipe) fd. */
size_t tnet_read_request(int fd, char *buf, size_t cap);

/* Send all of p to the socket fd (no SIGPIPE).  @return false on error. */
bool tnet_write_all(int fd, const void *p, size_t n);

/* Wait for the loop's next event, at most 2 ms (a turn of pump()). */
void tnet_loop_wait(uv_loop_t *loop);

/* How long TNET_RUN_UNTIL waits before it calls a hang. */
#define TNET_HANG_NS (20ull * 1000000000ull)

/* Do step until cond holds; fail with the message (a format and its
 * arguments) once TNET_HANG_NS has passed: the event, not a time, decides. */
#define TNET_RUN_UNTIL(cond, step, ...)                                                  \
    do {                                                                                 \
        uint64_t until_ = uv_hrtime() + TNET_HANG_NS;                                    \
        while (!(cond)) {                                                                \
            cr_assert_lt(uv_hrtime(), until_, __VA_ARGS__);                              \
            step;                                                                        \
        }                                                                                \
    } while (0)

#endif
