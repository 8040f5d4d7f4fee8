/* http.h -- the metrics endpoint: a minimal HTTP/1.1 server on the daemon's
 * libuv loop that answers GET /metrics (and GET /) with a text body made
 * on demand, and closes each connection after one answer (internal to
 * server/net; net.c starts it when `metrics` is set).
 *
 * Limits: a request line of at most 1 KiB of printable ASCII, "METHOD
 * /target HTTP/d.d", else 400 at once (a NUL byte included); headers of at
 * most 4 KiB in all, else 431; 2 s from connecting to the end of the
 * headers, 10 s to take the answer; 16 connections at once, 4 per peer
 * address: a new connection closes its peer's oldest one still waiting for
 * its request when the peer has 4, or the oldest such of the peer holding
 * the most when all 16 are taken (http.c).  Anything but GET of /metrics
 * or / is answered 404 or 405.  Rendering runs on the loop thread: it
 * reads counters only (microseconds).
 */
#ifndef AP_NET_HTTP_H
#define AP_NET_HTTP_H

#include <sys/socket.h>

#include "../../common/base.h"

struct uv_loop_s;
typedef struct ap_http ap_http;

/* Makes the body of one answer: malloc'd text and *len, NULL when out of
 * memory (answered 500). */
typedef char *(*ap_http_render_fn)(void *arg, size_t *len);

/* Listens on `spec` ("[HOST:]PORT", ":PORT" or "[IPv6]:PORT"; no host:
 * 127.0.0.1) on `loop`.  0 and *out; AP_EINVAL (not an address), AP_EIO
 * (cannot listen), AP_ENOMEM, with `err`. */
int ap_http_start(struct uv_loop_s *loop, const char *spec, ap_http_render_fn render, void *arg,
		  __ap_give ap_http **out, ap_error *err);
/* The port it listens on (the one the kernel chose for port 0). */
int ap_http_port(const ap_http *h);
/* Closes the listener and every connection; the memory goes in the close
 * callbacks, so the loop must run once more.  Accepts NULL. */
void ap_http_close(__ap_take ap_http *h);

/* Parses "HOST:PORT" or "[IPv6]:PORT" (and, with `bare_port`, "PORT" or
 * ":PORT") into *addr; an empty host is `default_host`.  `what` names the
 * setting in the message.  0 or AP_EINVAL. */
int ap__net_parse_host_port(const char *spec, const char *default_host, bool bare_port,
			    const char *what, struct sockaddr_storage *addr, ap_error *err);

#endif
