/* src/gateway/log.h - idemd's log: process events and one line per request
 * (log.c).
 *
 * Lines go to stderr, as text or JSON (--log-format).  idem__log writes a
 * process event at once; a request's line goes to its worker's buffer,
 * which the worker flushes once per loop turn.  Nothing here needs a loop:
 * the worker and the request are only named.
 *
 * THREADING: idem__log from any thread; the rest on the worker's loop thread.
 */
#ifndef IDEM_GATEWAY_LOG_H
#define IDEM_GATEWAY_LOG_H

typedef struct idem_gw idem_gw_t;
typedef struct idem_worker idem_worker_t;
typedef struct idem_req idem_req_t;

void idem__log(idem_gw_t *gw, const char *level, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/** One access-log line for a finished request into the worker's buffer. */
void idem__log_request(idem_worker_t *w, const idem_req_t *req);
void idem__log_flush(idem_worker_t *w);

#endif /* IDEM_GATEWAY_LOG_H */
