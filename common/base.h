/* base.h -- what every Apollo module shares: ownership markers, error codes
 * and the error record a failing call fills in.
 *
 * Ownership, as isl writes it:
 *   __ap_give  the caller owns the returned pointer and must free it;
 *   __ap_take  the callee consumes the argument, even when it fails;
 *   __ap_keep  the callee only borrows the argument.
 * Error codes are negative, as in libuv; 0 is success.  Each code maps one
 * to one onto apollo.ErrorCode on the wire (ap_error_wire_code()).
 */
#ifndef AP_BASE_H
#define AP_BASE_H

#include <stddef.h>
#include <stdio.h>
#include <stdint.h>
#include <stdbool.h>

#define __ap_give
#define __ap_take
#define __ap_keep

enum {
	AP_OK = 0,
	AP_EFRAME = -1,       /* framing: bad length, truncated frame */
	AP_EMESSAGE = -2,     /* bytes that do not decode */
	AP_EINVAL = -3,       /* invalid graph: dangling reference, cycle, bad attribute */
	AP_EUNSUPPORTED = -4, /* unknown op, dtype or target */
	AP_ESHAPE = -5,       /* mismatched shapes or dtypes */
	AP_ETOOLARGE = -6,    /* dimension/size overflow, configured limit exceeded */
	AP_ECOMPILE = -7,     /* NVRTC or host cc failed */
	AP_EINTERNAL = -8,    /* a bug or an I/O failure inside Apollo */
	AP_EBUSY = -9,        /* shutting down, queue full */
	AP_EVERSION = -10,    /* incompatible peer */
	AP_ENOMEM = -11,      /* allocation failed */
	AP_EIO = -12,         /* socket, file or database I/O failed */
};

/* What went wrong and where.  `node` / `tensor` name the graph element the
 * error concerns ("" when none).  Fixed size: filling it never allocates. */
typedef struct ap_error {
	int code;
	char msg[512];
	char node[128];
	char tensor[128];
} ap_error;

/* Sets all fields of `err` (which may be NULL) and returns `code`, so that
 * an error path reads `return ap_error_set(err, AP_EINVAL, node, NULL,
 * "axis %d out of range", axis);`.  `node` / `tensor` may be NULL. */
int ap_error_set(ap_error *err, int code, const char *node, const char *tensor,
		 const char *fmt, ...) __attribute__((format(printf, 5, 6)));

/* Clears `err` to AP_OK. */
void ap_error_clear(ap_error *err);

/* Short name of an error code ("invalid graph", ...); never NULL. */
const char *ap_error_name(int code);

/* The apollo.ErrorCode value (proto/apollo.proto) for an AP_E* code. */
int ap_error_wire_code(int code);

/* A malloc'd copy of the NUL-terminated string `s`; a NULL `s` is copied
 * as "" (so the result is never NULL for lack of input).  The caller owns
 * the result and frees it with free().  Returns NULL only when the
 * allocation fails (ENOMEM). */
__ap_give char *ap_strdup(__ap_keep const char *s);

/* Writes `s` as a JSON string literal (quotes and escapes; NULL as ""). */
void ap__json_string(FILE *f, const char *s);

/* `v` converted to int64 without undefined behaviour (C11 6.3.1.4): NaN
 * gives 0, values beyond the int64 range saturate, others truncate toward
 * zero. */
int64_t ap_f64_to_i64(double v);

/* Monotonic clock in milliseconds (CLOCK_MONOTONIC). */
double ap_now_ms(void);

/* Apollo's compiler version: part of every cache key. */
#define AP_VERSION "0.1.0"

#endif
