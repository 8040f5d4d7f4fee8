/* frame.c -- length prefixes and the default socket path (see frame.h). */
#include "frame.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

uint32_t ap_frame_get_len(const uint8_t hdr[AP_FRAME_HEADER_BYTES])
{
	return (uint32_t)hdr[0] << 24 | (uint32_t)hdr[1] << 16 |
	       (uint32_t)hdr[2] << 8 | (uint32_t)hdr[3];
}

void ap_frame_put_len(uint8_t hdr[AP_FRAME_HEADER_BYTES], uint32_t len)
{
	hdr[0] = len >> 24;
	hdr[1] = len >> 16;
	hdr[2] = len >> 8;
	hdr[3] = len;
}

int ap_frame_check_len(uint32_t len, uint32_t max, ap_error *err)
{
	if (len == 0)
		return ap_error_set(err, AP_EFRAME, NULL, NULL,
				    "frame length is 0: a frame carries one Envelope of at least 1 byte");
	if (len > max)
		return ap_error_set(err, AP_ETOOLARGE, NULL, NULL,
				    "frame length %u exceeds the limit of %u bytes", len, max);
	return 0;
}

int ap_default_socket_path(char *buf, size_t cap)
{
	const char *env = getenv("APOLLO_SOCKET");
	int n;

	if (env && *env)
		n = snprintf(buf, cap, "%s", env);
	else
		n = snprintf(buf, cap, "/tmp/apollod-%u.sock", (unsigned)getuid());
	if (n < 0 || (size_t)n >= cap || n > 107)
		return AP_ETOOLARGE;
	return 0;
}
