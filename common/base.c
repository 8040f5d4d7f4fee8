/* base.c -- error records, string copies and the monotonic clock (see base.h). */
#include "base.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static void copy_name(char *dst, size_t cap, const char *src)
{
	if (!src) {
		dst[0] = '\0';
		return;
	}
	snprintf(dst, cap, "%s", src);
}

int ap_error_set(ap_error *err, int code, const char *node, const char *tensor,
		 const char *fmt, ...)
{
	va_list ap;

	if (!err)
		return code;
	err->code = code;
	copy_name(err->node, sizeof(err->node), node);
	copy_name(err->tensor, sizeof(err->tensor), tensor);
	va_start(ap, fmt);
	vsnprintf(err->msg, sizeof(err->msg), fmt, ap);
	va_end(ap);
	return code;
}

void ap_error_clear(ap_error *err)
{
	if (err)
		memset(err, 0, sizeof(*err));
}

const char *ap_error_name(int code)
{
	switch (code) {
	case AP_OK: return "ok";
	case AP_EFRAME: return "bad frame";
	case AP_EMESSAGE: return "bad message";
	case AP_EINVAL: return "invalid graph";
	case AP_EUNSUPPORTED: return "unsupported";
	case AP_ESHAPE: return "shape mismatch";
	case AP_ETOOLARGE: return "too large";
	case AP_ECOMPILE: return "compile failed";
	case AP_EINTERNAL: return "internal error";
	case AP_EBUSY: return "busy";
	case AP_EVERSION: return "version mismatch";
	case AP_ENOMEM: return "out of memory";
	case AP_EIO: return "I/O error";
	}
	return "unknown error";
}

int ap_error_wire_code(int code)
{
	switch (code) {
	case AP_OK: return 0;
	case AP_EFRAME: return 1;
	case AP_EMESSAGE: return 2;
	case AP_EINVAL: return 3;
	case AP_EUNSUPPORTED: return 4;
	case AP_ESHAPE: return 5;
	case AP_ETOOLARGE: return 6;
	case AP_ECOMPILE: return 7;
	case AP_EBUSY: return 9;
	case AP_EVERSION: return 10;
	default: return 8;
	}
}

__ap_give char *ap_strdup(__ap_keep const char *s)
{
	size_t n;
	char *d;

	if (!s)
		s = "";
	n = strlen(s) + 1;
	d = malloc(n);
	if (d)
		memcpy(d, s, n);
	return d;
}

int64_t ap_f64_to_i64(double v)
{
	if (v != v)
		return 0;
	if (v >= 0x1p63)
		return INT64_MAX;
	if (v <= -0x1p63)
		return INT64_MIN;
	return (int64_t)v;
}

double ap_now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

void ap__json_string(FILE *f, const char *s)
{
	fputc('"', f);
	for (; s && *s; s++) {
		unsigned char ch = (unsigned char)*s;

		if (ch == '"' || ch == '\\')
			fprintf(f, "\\%c", ch);
		else if (ch < 0x20)
			fprintf(f, "\\u%04x", ch);
		else
			fputc(ch, f);
	}
	fputc('"', f);
}
