/* http.c -- the metrics endpoint (see http.h).  With net.c, the only files
 * that include uv.h (both are server/net, the module that wraps libuv).
 *
 * Approach: one listening TCP handle; each connection reads into a 4 KiB
 * buffer until the blank line that ends the headers, answers once
 * (status line, Content-Type, Content-Length, Connection: close, body),
 * and closes when the answer is written.  The request line is checked as
 * it arrives: a byte that is not printable ASCII (a NUL, a control, a byte
 * above 0x7e), a line over HTTP_MAX_LINE bytes, or one that is not
 * "METHOD /target HTTP/d.d" is answered 400 at once.  A timer closes a
 * connection that has not sent its request within HTTP_HEADER_TIMEOUT_MS,
 * or not taken its answer within HTTP_SEND_TIMEOUT_MS.  Once the answer
 * is written the daemon ends its side and reads what the client still
 * sends until it closes, HTTP_LINGER_MS at most, so that closing with a
 * request unread does not reset the connection and lose the answer.  A connection owns
 * two handles (stream and timer) and is freed when both have closed; the
 * endpoint itself is freed when its listener and all connections have.
 *
 * Slots (issue 29, item 9): HTTP_MAX_CONNS connections at once, at most
 * HTTP_MAX_PER_PEER of them from one peer address.  A new connection is
 * always taken: when its peer already holds its share, that peer's oldest
 * connection still waiting for its request is closed; when every slot is
 * taken, the oldest such connection of the peer holding the most is
 * (connections done with their answer count as such); only when every
 * other connection is being answered is the new one closed.
 * So idle connections, from however many peers, cannot keep a scrape out:
 * they make way for it.
 */
#include "http.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <uv.h>

#include "../config.h"

#define HTTP_MAX_REQUEST 4096       /* request line and headers, bytes */
#define HTTP_MAX_LINE 1024          /* the request line, bytes */
#define HTTP_HEADER_TIMEOUT_MS 2000 /* from accepting to the end of the headers */
#define HTTP_SEND_TIMEOUT_MS 10000  /* from the request to the answer written */
#define HTTP_LINGER_MS 1000        /* after the answer, for the client to close */
#define HTTP_MAX_CONNS 16
#define HTTP_MAX_PER_PEER 4

typedef struct hconn hconn;

struct ap_http {
	uv_tcp_t listener;
	ap_http_render_fn render;
	void *arg;
	hconn *conns;
	unsigned n_conns;
	uint64_t next_seq;
	bool closing, listener_closed;
	int port;
};

struct hconn {
	uv_tcp_t tcp;
	uv_timer_t timer;
	uv_write_t write;
	uv_shutdown_t shut;
	ap_http *h;
	hconn *prev, *next;
	int open_handles;       /* tcp and timer: freed when both closed */
	bool closing, answered;
	bool lingering;         /* answer written, waiting for the client to close */
	uint64_t seq;           /* accept order: smaller is older */
	uint8_t peer[17];       /* address family and address, no port */
	size_t n;
	char req[HTTP_MAX_REQUEST];
	char head[256];
	char *body;
};

int ap__net_parse_host_port(const char *spec, const char *default_host, bool bare_port,
			    const char *what, struct sockaddr_storage *addr, ap_error *err)
{
	char host[256];
	const char *colon, *port_s;
	char *end;
	long port;
	bool v6 = false;

	if (spec[0] == '[') {
		const char *rb = strchr(spec, ']');

		if (!rb || rb[1] != ':' || (size_t)(rb - spec - 1) >= sizeof(host))
			goto bad;
		memcpy(host, spec + 1, (size_t)(rb - spec - 1));
		host[rb - spec - 1] = '\0';
		port_s = rb + 2;
		v6 = true;
	} else {
		size_t hlen;

		colon = strrchr(spec, ':');
		if (colon) {
			hlen = (size_t)(colon - spec);
			port_s = colon + 1;
		} else if (bare_port) {
			hlen = 0;
			port_s = spec;
		} else {
			goto bad;
		}
		if (hlen >= sizeof(host))
			goto bad;
		memcpy(host, spec, hlen);
		host[hlen] = '\0';
	}
	port = strtol(port_s, &end, 10);
	if (end == port_s || *end || port < 0 || port > 65535)
		goto bad;
	if (!*host)
		snprintf(host, sizeof(host), "%s", default_host);
	if (v6 ? uv_ip6_addr(host, (int)port, (struct sockaddr_in6 *)addr)
	       : uv_ip4_addr(host, (int)port, (struct sockaddr_in *)addr))
		goto bad;
	return 0;
bad:
	return ap_error_set(err, AP_EINVAL, NULL, NULL,
			    "%s: '%.200s' is not %sHOST:PORT (an IPv4 address, or [IPv6]:PORT)", what,
			    spec, bare_port ? "PORT, :PORT or " : "");
}

static void maybe_free_endpoint(ap_http *h)
{
	if (h->closing && h->listener_closed && !h->conns)
		free(h);
}

static void on_hconn_closed(uv_handle_t *handle)
{
	hconn *c = handle->data;
	ap_http *h = c->h;

	if (--c->open_handles > 0)
		return;
	if (c->prev)
		c->prev->next = c->next;
	else
		h->conns = c->next;
	if (c->next)
		c->next->prev = c->prev;
	h->n_conns--;
	free(c->body);
	free(c);
	maybe_free_endpoint(h);
}

static void hconn_close(hconn *c)
{
	if (c->closing)
		return;
	c->closing = true;
	uv_close((uv_handle_t *)&c->tcp, on_hconn_closed);
	uv_close((uv_handle_t *)&c->timer, on_hconn_closed);
}

static void on_read(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf);
static void on_timeout(uv_timer_t *t);

static void on_drain_alloc(uv_handle_t *handle, size_t suggested, uv_buf_t *buf)
{
	hconn *c = handle->data;

	buf->base = c->req;
	buf->len = HTTP_MAX_REQUEST;
}

static void on_shutdown(uv_shutdown_t *req, int status)
{
	hconn *c = req->data;

	if (status < 0 || c->closing ||
	    uv_read_start((uv_stream_t *)&c->tcp, on_drain_alloc, on_read))
		hconn_close(c);
}

/* The answer is written: end our side (FIN) and read what the client
 * still sends until it closes (at most HTTP_LINGER_MS), so that the close
 * does not reset the connection with its request unread and lose the
 * answer (a 400 or 431 sent before the whole request arrived). */
static void on_written(uv_write_t *req, int status)
{
	hconn *c = req->data;

	if (status < 0 || c->closing) {
		hconn_close(c);
		return;
	}
	c->lingering = true;
	uv_timer_start(&c->timer, on_timeout, HTTP_LINGER_MS, 0);
	c->shut.data = c;
	if (uv_shutdown(&c->shut, (uv_stream_t *)&c->tcp, on_shutdown))
		hconn_close(c);
}

static void on_timeout(uv_timer_t *t)
{
	hconn_close(t->data);
}

/* Writes a fixed answer without a body (400, 431) and closes. */
static void answer_status(hconn *c, const char *status)
{
	int n;

	c->answered = true;
	uv_read_stop((uv_stream_t *)&c->tcp);
	uv_timer_start(&c->timer, on_timeout, HTTP_SEND_TIMEOUT_MS, 0);
	n = snprintf(c->head, sizeof(c->head),
		     "HTTP/1.1 %s\r\nContent-Length: 0\r\nConnection: close\r\n\r\n", status);
	c->write.data = c;
	{
		uv_buf_t b = uv_buf_init(c->head, (unsigned)n);

		if (uv_write(&c->write, (uv_stream_t *)&c->tcp, &b, 1, on_written))
			hconn_close(c);
	}
}

/* Checks what has arrived of the request: -1 when the request line is
 * malformed (a byte that is not printable ASCII, longer than
 * HTTP_MAX_LINE, not "METHOD /target HTTP/d.d") or a header holds a NUL;
 * 1 when the headers are complete; 0 when more is needed. */
static int check_request(const hconn *c)
{
	const char *p = c->req, *nl = memchr(p, '\n', c->n), *sp1, *sp2;
	size_t line = nl ? (size_t)(nl - p) : c->n;

	if (line > 0 && p[line - 1] == '\r')   /* its \n may come next */
		line--;
	for (size_t i = 0; i < line; i++)
		if ((unsigned char)p[i] < 0x20 || (unsigned char)p[i] > 0x7e)
			return -1;
	if (line > HTTP_MAX_LINE || (!nl && c->n > HTTP_MAX_LINE))
		return -1;
	if (!nl)
		return 0;
	/* METHOD SP /target SP HTTP/d.d */
	sp1 = memchr(p, ' ', line);
	sp2 = sp1 ? memchr(sp1 + 1, ' ', line - (size_t)(sp1 + 1 - p)) : NULL;
	if (!sp1 || sp1 == p || !sp2 || sp1[1] != '/' ||
	    (size_t)(p + line - (sp2 + 1)) != 8 || memcmp(sp2 + 1, "HTTP/", 5) ||
	    sp2[6] < '0' || sp2[6] > '9' || sp2[7] != '.' || sp2[8] < '0' || sp2[8] > '9')
		return -1;
	for (const char *m = p; m < sp1; m++)
		if (*m < 'A' || *m > 'Z')
			return -1;
	if (memchr(p, '\0', c->n))
		return -1;
	return memmem(p, c->n, "\r\n\r\n", 4) || memmem(p, c->n, "\n\n", 2) ? 1 : 0;
}

/* Answers the request in c->req (complete headers, request line checked). */
static void answer(hconn *c)
{
	const char *status = "200 OK", *type = "text/plain; version=0.0.4; charset=utf-8";
	char method[8] = "", path[64] = "";
	uv_buf_t bufs[2];
	size_t len = 0;
	int n;

	c->answered = true;
	uv_read_stop((uv_stream_t *)&c->tcp);
	uv_timer_start(&c->timer, on_timeout, HTTP_SEND_TIMEOUT_MS, 0);
	if (sscanf(c->req, "%7s %63s", method, path) != 2) {
		status = "400 Bad Request";
	} else if (strcmp(method, "GET") && strcmp(method, "HEAD")) {
		status = "405 Method Not Allowed";
	} else {
		path[strcspn(path, "?")] = '\0';
		if (strcmp(path, "/metrics") && strcmp(path, "/"))
			status = "404 Not Found";
	}
	if (!strcmp(status, "200 OK")) {
		c->body = c->h->render(c->h->arg, &len);
		if (!c->body)
			status = "500 Internal Server Error";
	}
	if (strcmp(status, "200 OK")) {
		free(c->body);
		c->body = NULL;
		len = 0;
		type = "text/plain; charset=utf-8";
	}
	n = snprintf(c->head, sizeof(c->head),
		     "HTTP/1.1 %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\n"
		     "Connection: close\r\n\r\n", status, type, len);
	bufs[0] = uv_buf_init(c->head, (unsigned)n);
	bufs[1] = uv_buf_init(c->body ? c->body : (char *)"", strcmp(method, "HEAD") ? (unsigned)len : 0);
	c->write.data = c;
	if (uv_write(&c->write, (uv_stream_t *)&c->tcp, bufs, 2, on_written))
		hconn_close(c);
}

static void on_alloc(uv_handle_t *handle, size_t suggested, uv_buf_t *buf)
{
	hconn *c = handle->data;

	buf->base = c->req + c->n;
	buf->len = HTTP_MAX_REQUEST - 1 - c->n;
}

static void on_read(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf)
{
	hconn *c = s->data;

	if (nread < 0) {
		hconn_close(c);
		return;
	}
	if (c->answered)
		return;   /* lingering: dropped */
	c->n += (size_t)nread;
	c->req[c->n] = '\0';
	switch (check_request(c)) {
	case -1:
		answer_status(c, "400 Bad Request");
		break;
	case 1:
		answer(c);
		break;
	default:
		if (c->n >= HTTP_MAX_REQUEST - 1)
			answer_status(c, "431 Request Header Fields Too Large");
		break;
	}
}

/* The peer's address without the port, into c->peer (zeros if unknown). */
static void peer_key(hconn *c)
{
	struct sockaddr_storage ss;
	int len = sizeof(ss);

	memset(c->peer, 0, sizeof(c->peer));
	if (uv_tcp_getpeername(&c->tcp, (struct sockaddr *)&ss, &len))
		return;
	c->peer[0] = (uint8_t)ss.ss_family;
	if (ss.ss_family == AF_INET)
		memcpy(c->peer + 1, &((struct sockaddr_in *)&ss)->sin_addr, 4);
	else if (ss.ss_family == AF_INET6)
		memcpy(c->peer + 1, &((struct sockaddr_in6 *)&ss)->sin6_addr, 16);
}

/* Open connections of c's peer, c included. */
static unsigned peer_count(const ap_http *h, const hconn *c)
{
	unsigned n = 0;

	for (const hconn *o = h->conns; o; o = o->next)
		n += !o->closing && !memcmp(o->peer, c->peer, sizeof(c->peer));
	return n;
}

/* The oldest connection of c's peer still waiting for its request, or
 * done with its answer. */
static hconn *oldest_waiting(const ap_http *h, const hconn *c)
{
	hconn *best = NULL;

	for (hconn *o = h->conns; o; o = o->next)
		if (o != c && !o->closing && (!o->answered || o->lingering) &&
		    !memcmp(o->peer, c->peer, sizeof(c->peer)) &&
		    (!best || o->seq < best->seq))
			best = o;
	return best;
}

/* Makes room for the new connection `c` (see the file comment). */
static void make_room(ap_http *h, hconn *c)
{
	hconn *victim = NULL;
	unsigned total = 0, most = 0;

	for (hconn *o = h->conns; o; o = o->next)
		total += !o->closing;
	if (peer_count(h, c) > HTTP_MAX_PER_PEER) {
		victim = oldest_waiting(h, c);
	} else if (total > HTTP_MAX_CONNS) {
		for (hconn *o = h->conns; o; o = o->next) {
			unsigned n;
			hconn *w;

			if (o == c || o->closing || (o->answered && !o->lingering))
				continue;
			n = peer_count(h, o);
			w = oldest_waiting(h, o);
			if (w && (n > most || (n == most && w->seq < victim->seq))) {
				most = n;
				victim = w;
			}
		}
	} else {
		return;
	}
	hconn_close(victim ? victim : c);
}

static void on_connection(uv_stream_t *listener, int status)
{
	ap_http *h = listener->data;
	hconn *c;

	if (status < 0 || h->closing)
		return;
	c = calloc(1, sizeof(*c));
	if (!c)
		return;
	c->h = h;
	uv_tcp_init(listener->loop, &c->tcp);
	uv_timer_init(listener->loop, &c->timer);
	c->tcp.data = c->timer.data = c;
	c->open_handles = 2;
	c->next = h->conns;
	if (h->conns)
		h->conns->prev = c;
	h->conns = c;
	h->n_conns++;
	c->seq = h->next_seq++;
	if (uv_accept(listener, (uv_stream_t *)&c->tcp)) {
		hconn_close(c);
		return;
	}
	peer_key(c);
	make_room(h, c);
	if (c->closing)
		return;
	uv_timer_start(&c->timer, on_timeout, HTTP_HEADER_TIMEOUT_MS, 0);
	if (uv_read_start((uv_stream_t *)&c->tcp, on_alloc, on_read))
		hconn_close(c);
}

int ap_http_start(struct uv_loop_s *loop, const char *spec, ap_http_render_fn render, void *arg,
		  ap_http **out, ap_error *err)
{
	struct sockaddr_storage addr;
	int namelen = sizeof(addr);
	ap_http *h;
	int r, rc;

	*out = NULL;
	memset(&addr, 0, sizeof(addr));
	if ((rc = ap__net_parse_host_port(spec, "127.0.0.1", true, "metrics", &addr, err)))
		return rc;
	h = calloc(1, sizeof(*h));
	if (!h)
		return ap_error_set(err, AP_ENOMEM, NULL, NULL, "out of memory");
	h->render = render;
	h->arg = arg;
	uv_tcp_init(loop, &h->listener);
	h->listener.data = h;
	r = uv_tcp_bind(&h->listener, (const struct sockaddr *)&addr, 0);
	if (!r)
		r = uv_listen((uv_stream_t *)&h->listener, 16, on_connection);
	if (r) {
		rc = ap_error_set(err, AP_EIO, NULL, NULL, "metrics: cannot listen on %s: %s", spec,
				  uv_strerror(r));
		ap_http_close(h);
		return rc;
	}
	if (uv_tcp_getsockname(&h->listener, (struct sockaddr *)&addr, &namelen) == 0)
		h->port = ntohs(addr.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&addr)->sin6_port
							   : ((struct sockaddr_in *)&addr)->sin_port);
	*out = h;
	return 0;
}

int ap_http_port(const ap_http *h)
{
	return h ? h->port : 0;
}

static void on_listener_closed(uv_handle_t *handle)
{
	ap_http *h = handle->data;

	h->listener_closed = true;
	maybe_free_endpoint(h);
}

void ap_http_close(ap_http *h)
{
	if (!h || h->closing)
		return;
	h->closing = true;
	for (hconn *c = h->conns; c; c = c->next)
		hconn_close(c);
	uv_close((uv_handle_t *)&h->listener, on_listener_closed);
}
