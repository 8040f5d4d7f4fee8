/* check_frame.c -- framing, error records and the default socket path
 * (common/frame.c, common/base.c). */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
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

/* Issue 11, item 2: the default socket is never a file directly in
 * world-writable /tmp, where another user could create it first. */
START_TEST(default_socket)
{
	char buf[128], want[64];

	setenv("APOLLO_SOCKET", "/tmp/x.sock", 1);
	ck_assert_int_eq(ap_default_socket_path(buf, sizeof(buf)), 0);
	ck_assert_str_eq(buf, "/tmp/x.sock");
	unsetenv("APOLLO_SOCKET");
	setenv("XDG_RUNTIME_DIR", "/run/user/1234", 1);
	ck_assert_int_eq(ap_default_socket_path(buf, sizeof(buf)), 0);
	ck_assert_str_eq(buf, "/run/user/1234/apollod.sock");
	setenv("XDG_RUNTIME_DIR", "relative/dir", 1);   /* not absolute: ignored */
	ck_assert_int_eq(ap_default_socket_path(buf, sizeof(buf)), 0);
	snprintf(want, sizeof(want), "/tmp/apollod-%u/apollod.sock", (unsigned)geteuid());
	ck_assert_str_eq(buf, want);
	unsetenv("XDG_RUNTIME_DIR");
	ck_assert_int_eq(ap_default_socket_path(buf, sizeof(buf)), 0);
	ck_assert_str_eq(buf, want);
	ck_assert_int_eq(ap_default_socket_path(buf, 4), AP_ETOOLARGE);
}
END_TEST

/* The daemon's check of its socket directory: created private when
 * missing; refused when another user owns it, when anyone may write to it
 * (unless sticky), and when the default's private directory is not. */
START_TEST(socket_dir_check)
{
	char base[] = "/tmp/apollo-sockdir-XXXXXX", path[256], cmd[300];
	struct stat st;
	ap_error err;

	ck_assert_ptr_nonnull(mkdtemp(base));
	snprintf(path, sizeof(path), "%s/new/apollod.sock", base);
	ck_assert_int_eq(ap_socket_dir_check(path, &err), 0);
	snprintf(path, sizeof(path), "%s/new", base);
	ck_assert_int_eq(stat(path, &st), 0);
	ck_assert_int_eq(st.st_mode & 0777, 0700);

	/* writable by others, not sticky */
	snprintf(path, sizeof(path), "%s/open", base);
	ck_assert_int_eq(mkdir(path, 0700), 0);
	ck_assert_int_eq(chmod(path, 0777), 0);
	snprintf(path, sizeof(path), "%s/open/apollod.sock", base);
	ck_assert_int_eq(ap_socket_dir_check(path, &err), AP_EIO);
	ck_assert_ptr_nonnull(strstr(err.msg, "writable by other users"));
	/* the same, sticky (like /tmp): the socket file itself cannot be
	 * replaced by others */
	snprintf(path, sizeof(path), "%s/open", base);
	ck_assert_int_eq(chmod(path, 01777), 0);
	snprintf(path, sizeof(path), "%s/open/apollod.sock", base);
	ck_assert_int_eq(ap_socket_dir_check(path, &err), 0);

	/* the default's private directory, made by someone else first */
	snprintf(path, sizeof(path), "%s/apollod-%u", base, (unsigned)geteuid());
	ck_assert_int_eq(mkdir(path, 0755), 0);
	snprintf(path, sizeof(path), "%s/apollod-%u/apollod.sock", base, (unsigned)geteuid());
	ck_assert_int_eq(ap_socket_dir_check(path, &err), AP_EIO);
	ck_assert_ptr_nonnull(strstr(err.msg, "private"));
	if (geteuid() == 0) {
		/* owned by another user (nobody) */
		snprintf(path, sizeof(path), "%s/theirs", base);
		ck_assert_int_eq(mkdir(path, 0755), 0);
		ck_assert_int_eq(chown(path, 65534, 65534), 0);
		snprintf(path, sizeof(path), "%s/theirs/apollod.sock", base);
		ck_assert_int_eq(ap_socket_dir_check(path, &err), AP_EIO);
		ck_assert_ptr_nonnull(strstr(err.msg, "belongs to uid 65534"));
	} else {
		printf("socket_dir_check: the other-owner case needs root (chown): skipped\n");
	}
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", base);
	ck_assert_int_eq(system(cmd), 0);
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
	tcase_add_test(tc, socket_dir_check);
	tcase_add_test(tc, error_records);
	suite_add_tcase(s, tc);
	sr = srunner_create(s);
	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? 1 : 0;
}
