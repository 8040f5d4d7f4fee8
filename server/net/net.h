/* net.h -- apollod's network front: the libuv loop, its listeners and
 * connections, and the dispatch of each request frame.
 *
 * One loop thread owns every socket.  Frames (common/frame.h) are read
 * incrementally; each length is checked against max_frame_bytes
 * (max_unauth_frame_bytes before a TCP client has authenticated) before
 * anything is allocated, and decoding has a memory budget
 * (decode_memory_ratio).  Admission, authentication, time limits, the
 * memory of queued replies and of requests waiting for a worker
 * (max_compile_memory, max_pending_memory) are net.c's (see its file
 * comment and docs/security.md).  A payload over 64 KiB is unpacked on a worker
 * thread (libuv's pool, sized by `workers`), smaller ones on the loop
 * thread; a connection's frames are dispatched one at a time in arrival
 * order either way.  Ping, Hello and Stats are answered on the loop
 * thread; each CompileRequest goes to a worker thread and its reply is
 * written from the loop thread when it is done.  SIGTERM / SIGINT stop the listeners, let the requests in flight
 * finish and be answered, close the connections, remove the socket file
 * and make ap_server_run return 0.
 */
#ifndef AP_NET_H
#define AP_NET_H

#include "../../common/base.h"
#include "../cache/cache.h"
#include "../compile/compile.h"
#include "../config.h"

typedef struct ap_server ap_server;

/* Creates the loop and binds the listeners of `cfg`: the Unix socket
 * (cfg->socket, else ap_default_socket_path; its directory must pass
 * ap_socket_dir_check, else AP_EIO; a stale socket file is removed, a
 * live daemon on it is AP_EBUSY) and the TCP listener when
 * cfg->tcp is set (needs cfg->tcp_token).  Sets the worker pool size.
 * `compiler` and `cache` are borrowed and must outlive the server.
 * Returns 0 and *out, or AP_EBUSY / AP_EINVAL / AP_EIO / AP_ENOMEM with
 * `err` saying why (nothing is left bound). */
int ap_server_new(const ap_config *cfg, __ap_keep ap_compiler *compiler,
		  __ap_keep ap_cache *cache, __ap_give ap_server **out, ap_error *err);

/* Serves until SIGTERM or SIGINT has been drained.  Returns 0, or AP_EIO
 * when the loop failed. */
int ap_server_run(ap_server *s);

/* The Unix socket path in use. */
const char *ap_server_socket_path(const ap_server *s);

/* Closes whatever is still open, removes the socket file it created, frees.
 * Accepts NULL, returns NULL. */
ap_server *ap_server_free(__ap_take ap_server *s);

#endif
