/* http.c -- the metrics endpoint (see http.h).  With net.c, the only files
 * that include uv.h (both are server/net, the module that wraps libuv).
 *
 * Approach: one listening TCP handle; each connection reads into a 4 KiB
 * buffer until the blank line that ends the headers, answers once
 * (status line, Content-Type, Content-Length, Connection: close, body),
 * and closes when the answer is written.  A timer closes a connection
 * that has not sent its request within HTTP_TIMEOUT_MS.  A connection owns
 * two handles (stream and timer) and is freed when both have closed; the
 * endpoint itself is freed when its listener and all connections have.
 */
#include "http.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <uv.h>

#include "../config.h"

#define HTTP_MAX_REQUEST 4096
#define HTTP_TIMEOUT_MS 5000
#define HTTP_MAX_CONNS 16

typedef struct hconn hconn;

struct ap_http {
	uv_tcp_t listener;
	ap_http_render_fn render;
	void *arg;
	hconn *conns;
	unsigned n_conns;
	bool closing, listener_closed;
	int port;
};

struct hconn {
	uv_tcp_t tcp;
	uv_timer_t timer;
	uv_write_t write;
	ap_http *h;
	hconn *prev, *next;
	int open_handles;       /* tcp and timer: freed when both closed */
	bool closing, answered;
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

static void on_written(uv_write_t *req, int status)
{
	hconn_close(req->data);
}

static void on_timeout(uv_timer_t *t)
{
	hconn_close(t->data);
}

/* Answers the request in c->req (complete headers). */
static void answer(hconn *c)
{
	const char *status = "200 OK", *type = "text/plain; version=0.0.4; charset=utf-8";
	char method[8] = "", path[64] = "";
	uv_buf_t bufs[2];
	size_t len = 0;
	int n;

	c->answered = true;
	uv_read_stop((uv_stream_t *)&c->tcp);
	uv_timer_stop(&c->timer);
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
	c->n += (size_t)nread;
	c->req[c->n] = '\0';
	if (strstr(c->req, "\r\n\r\n") || strstr(c->req, "\n\n")) {
		answer(c);
	} else if (c->n >= HTTP_MAX_REQUEST - 1) {
		static const char msg[] = "HTTP/1.1 431 Request Header Fields Too Large\r\n"
					  "Content-Length: 0\r\nConnection: close\r\n\r\n";
		uv_buf_t b = uv_buf_init((char *)msg, sizeof(msg) - 1);

		c->answered = true;
		uv_read_stop(s);
		c->write.data = c;
		if (uv_write(&c->write, s, &b, 1, on_written))
			hconn_close(c);
	}
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
	if (uv_accept(listener, (uv_stream_t *)&c->tcp) || h->n_conns > HTTP_MAX_CONNS) {
		hconn_close(c);
		return;
	}
	uv_timer_start(&c->timer, on_timeout, HTTP_TIMEOUT_MS, 0);
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
