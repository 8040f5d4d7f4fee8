/* check_frame.c -- framing, error records and the default socket path
 * (common/frame.c, common/base.c). */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/frame.h"

START_TEST(length_round_trip)
{
	static const uint32_t lens[] = { 1, 255, 256, 65535, 0x01020304u, 0xffffffffu };
	uint8_t hdr[4];

	for (size_t i = 0; i < sizeof(lens) / sizeof(lens[0]); i++) {
		ap_frame_put_len(hdr, lens[i]);
		ck_assert_uint_eq(ap_frame_get_len(hdr), lens[i]);
	}
	ap_frame_put_len(hdr, 0x01020304u);
	ck_assert_uint_eq(hdr[0], 1); /* big-endian on the wire */
	ck_assert_uint_eq(hdr[3], 4);
}
END_TEST

START_TEST(length_limits)
{
	ap_error err;

	ck_assert_int_eq(ap_frame_check_len(1, 100, &err), 0);
	ck_assert_int_eq(ap_frame_check_len(100, 100, &err), 0);
	ck_assert_int_eq(ap_frame_check_len(0, 100, &err), AP_EFRAME);
	ck_assert_int_eq(ap_frame_check_len(101, 100, &err), AP_ETOOLARGE);
	ck_assert_ptr_nonnull(strstr(err.msg, "101"));
	ck_assert_ptr_nonnull(strstr(err.msg, "100"));
}
END_TEST

START_TEST(default_socket)
{
	char buf[128], want[64];

	setenv("APOLLO_SOCKET", "/tmp/x.sock", 1);
	ck_assert_int_eq(ap_default_socket_path(buf, sizeof(buf)), 0);
	ck_assert_str_eq(buf, "/tmp/x.sock");
	unsetenv("APOLLO_SOCKET");
	ck_assert_int_eq(ap_default_socket_path(buf, sizeof(buf)), 0);
	snprintf(want, sizeof(want), "/tmp/apollod-%u.sock", (unsigned)getuid());
	ck_assert_str_eq(buf, want);
	ck_assert_int_eq(ap_default_socket_path(buf, 4), AP_ETOOLARGE);
}
END_TEST

START_TEST(error_records)
{
	ap_error err;

	ck_assert_int_eq(ap_error_set(&err, AP_ESHAPE, "add_1", "y", "dims %d vs %d", 3, 4),
			 AP_ESHAPE);
	ck_assert_str_eq(err.msg, "dims 3 vs 4");
	ck_assert_str_eq(err.node, "add_1");
	ck_assert_str_eq(err.tensor, "y");
	ck_assert_int_eq(ap_error_wire_code(AP_ESHAPE), 5);
	ck_assert_int_eq(ap_error_wire_code(AP_ENOMEM), 8);
	ck_assert_str_eq(ap_error_name(AP_EINVAL), "invalid graph");
	ap_error_clear(&err);
	ck_assert_int_eq(err.code, 0);
	ck_assert_int_eq(ap_error_set(NULL, AP_EIO, NULL, NULL, "x"), AP_EIO);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("frame");
	TCase *tc = tcase_create("core");
	SRunner *sr;
	int failed;

	tcase_add_test(tc, length_round_trip);
	tcase_add_test(tc, length_limits);
	tcase_add_test(tc, default_socket);
	tcase_add_test(tc, error_records);
	suite_add_tcase(s, tc);
	sr = srunner_create(s);
	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? 1 : 0;
}
