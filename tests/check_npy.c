/* check_npy.c -- the .npy reader and writer of client/npy.c (what
 * `apollo-client run --input NAME=FILE.npy` reads, and the files the
 * onnxruntime reference is fed and answers with): every dtype through
 * encode and decode, headers written the ways numpy and people write them
 * (version 2.0, double quotes, no trailing comma, spaces), and the
 * malformed ones -- magic, version, header length, missing, repeated and
 * unknown keys, shapes that are not tuples, Fortran order, big-endian,
 * structured and unknown dtypes, too many dims or elements, truncated
 * data, trailing bytes, bool bytes other than 0/1 -- each refused with its
 * reason and before the data is allocated; files read through the path
 * reader (named in every error) and ap_tensor_file_read's .pb branch.
 */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "client/tool.h"

/* A .npy file: magic, version major.0, the header (padded to end in '\n'
 * when `pad`), then `dlen` data bytes (zeros when data is NULL). */
static uint8_t *npy_bytes(int major, const char *header, bool pad, const void *data, size_t dlen,
			  size_t *len)
{
	size_t hl = strlen(header), pre = major == 1 ? 10 : 12, total;
	uint8_t *b;

	if (pad)
		while ((pre + hl + 1) % 64)
			hl++;
	hl += pad;
	total = pre + hl + dlen;
	b = calloc(1, total + 1);
	ck_assert_ptr_nonnull(b);
	memcpy(b, "\x93NUMPY", 6);
	b[6] = (uint8_t)major;
	b[7] = 0;
	b[8] = (uint8_t)(hl & 0xff);
	b[9] = (uint8_t)(hl >> 8);
	if (major != 1) {
		b[10] = (uint8_t)(hl >> 16);
		b[11] = (uint8_t)(hl >> 24);
	}
	memset(b + pre, ' ', hl);
	memcpy(b + pre, header, strlen(header));
	if (pad)
		b[pre + hl - 1] = '\n';
	if (data)
		memcpy(b + pre + hl, data, dlen);
	*len = total;
	return b;
}

/* Decodes a hand-made file; the return code, *t the tensor (or NULL). */
static int decode(int major, const char *header, const void *data, size_t dlen, ap_host_tensor **t,
		  ap_error *err)
{
	size_t len;
	uint8_t *b = npy_bytes(major, header, true, data, dlen, &len);
	int rc;

	ap_error_clear(err);
	rc = ap_npy_decode(b, len, "t.npy", t, err);
	free(b);
	return rc;
}

/* The header must be refused with `code` and a message holding `what`. */
static void refused(const char *header, size_t dlen, int code, const char *what)
{
	ap_host_tensor *t = (ap_host_tensor *)1;
	ap_error err;
	int rc = decode(1, header, NULL, dlen, &t, &err);

	ck_assert_msg(rc == code, "%s: rc %d, want %d (%s)", header, rc, code, err.msg);
	ck_assert_ptr_null(t);
	ck_assert_msg(strstr(err.msg, what) && strstr(err.msg, "t.npy"), "%s: '%s' lacks '%s'",
		      header, err.msg, what);
}

START_TEST(npy_round_trip_every_dtype)
{
	static const ap_dtype dts[] = { AP_DT_F32, AP_DT_F64, AP_DT_F16, AP_DT_I64, AP_DT_I32,
					AP_DT_U8,  AP_DT_I8,  AP_DT_BOOL };
	static const int64_t shapes[][3] = { { 0 }, { 5 }, { 2, 3, 4 } };
	static const int ranks[] = { 0, 1, 3 };

	for (size_t i = 0; i < sizeof(dts) / sizeof(dts[0]); i++)
		for (int s = 0; s < 3; s++) {
			ap_host_tensor in = { .dtype = dts[i], .rank = ranks[s] }, *out;
			int64_t n = 1;
			uint8_t *buf;
			size_t len;
			ap_error err;

			memcpy(in.dims, shapes[s], sizeof(shapes[s]));
			for (int d = 0; d < in.rank; d++)
				n *= in.dims[d];
			in.nbytes = (size_t)n * ap_dtype_size(dts[i]);
			in.data = malloc(in.nbytes);
			for (int64_t k = 0; k < n; k++)
				ap_elem_set(in.data, dts[i], k, dts[i] == AP_DT_BOOL ? k % 2 : k - 3);
			ck_assert_int_eq(ap_npy_encode(&in, &buf, &len, &err), 0);
			ck_assert_uint_eq((len - in.nbytes) % 64, 0);   /* data 64-byte aligned */
			ck_assert_int_eq(ap_npy_decode(buf, len, "x", &out, &err), 0);
			ck_assert_int_eq(out->dtype, dts[i]);
			ck_assert_int_eq(out->rank, in.rank);
			ck_assert_mem_eq(out->dims, in.dims, sizeof(int64_t) * (size_t)in.rank);
			ck_assert_uint_eq(out->nbytes, in.nbytes);
			ck_assert_mem_eq(out->data, in.data, in.nbytes);
			ck_assert_ptr_null(out->name);
			ap_host_tensor_free(out);
			free(buf);
			free(in.data);
		}
}
END_TEST

START_TEST(npy_headers_as_written)
{
	float v[6] = { 1, 2, 3, 4, 5, 6 };
	ap_host_tensor *t;
	ap_error err;

	/* version 2.0; double quotes; no trailing comma; spaces everywhere */
	ck_assert_int_eq(decode(2, "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }",
				v, sizeof(v), &t, &err), 0);
	ck_assert_int_eq(t->rank, 2);
	ck_assert_int_eq(t->dims[1], 3);
	ck_assert(((float *)t->data)[5] == 6);
	ap_host_tensor_free(t);
	ck_assert_int_eq(decode(1, "{ \"shape\" : ( 6 , ) ,\"descr\":\"<f4\", \"fortran_order\":False}",
				v, sizeof(v), &t, &err), 0);
	ck_assert_int_eq(t->rank, 1);
	ck_assert_int_eq(t->dims[0], 6);
	ap_host_tensor_free(t);
	/* one-byte types written '<' too; a 1-D array may say Fortran order */
	ck_assert_int_eq(decode(1, "{'descr': '<u1', 'fortran_order': True, 'shape': (3,)}", v, 3,
				&t, &err), 0);
	ck_assert_int_eq(t->dtype, AP_DT_U8);
	ap_host_tensor_free(t);
	/* a scalar */
	ck_assert_int_eq(decode(1, "{'descr': '<f8', 'fortran_order': False, 'shape': ()}", v, 8, &t,
				&err), 0);
	ck_assert_int_eq(t->rank, 0);
	ck_assert_uint_eq(t->nbytes, 8);
	ap_host_tensor_free(t);
}
END_TEST

START_TEST(npy_malformed_headers)
{
	refused("{'descr': '<f4', 'shape': (2,)}", 8, AP_EINVAL, "'fortran_order' is missing");
	refused("{'descr': '<f4', 'fortran_order': False, 'shape': (2,), 'descr': '<f4'}", 8,
		AP_EINVAL, "key 'descr' is given twice");
	refused("{'descr': '<f4', 'fortran_order': False, 'shape': (2,), 'extra': 1}", 8, AP_EINVAL,
		"unknown key 'extra'");
	refused("{'descr': '<f4', 'fortran_order': False, 'shape': (2)}", 8, AP_EINVAL,
		"a 1-D shape is written (N,)");
	refused("{'descr': '<f4', 'fortran_order': False, 'shape': [2]}", 8, AP_EINVAL,
		"'shape' is not a tuple");
	refused("{'descr': '<f4', 'fortran_order': False, 'shape': (-1,)}", 8, AP_EINVAL,
		"non-negative integers");
	refused("{'descr': '<f4', 'fortran_order': False, 'shape': (2.5,)}", 8, AP_EINVAL,
		"not a tuple of integers");
	refused("{'descr': '<f4', 'fortran_order': 0, 'shape': (2,)}", 8, AP_EINVAL,
		"not True or False");
	refused("{'descr': '<f4', 'fortran_order': False, 'shape': (2,)} junk", 8, AP_EINVAL,
		"something follows the dict");
	refused("['descr', '<f4']", 8, AP_EINVAL, "it is not a dict");
	refused("{'descr': '<f4\\'', 'fortran_order': False, 'shape': (2,)}", 8, AP_EINVAL,
		"escaped");
	refused("{'descr': '<f4', 'fortran_order': True, 'shape': (2, 3)}", 24, AP_EUNSUPPORTED,
		"Fortran order");
	refused("{'descr': '>f4', 'fortran_order': False, 'shape': (2,)}", 8, AP_EUNSUPPORTED,
		"big-endian");
	refused("{'descr': '<i2', 'fortran_order': False, 'shape': (2,)}", 4, AP_EUNSUPPORTED,
		"'<i2' is not one Apollo takes");
	refused("{'descr': '<c8', 'fortran_order': False, 'shape': (2,)}", 16, AP_EUNSUPPORTED,
		"not one Apollo takes");
	refused("{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (2,)}", 8,
		AP_EUNSUPPORTED, "structured dtype");
	refused("{'descr': '<f4', 'fortran_order': False, 'shape': (1,1,1,1,1,1,1,1,1)}", 4,
		AP_EUNSUPPORTED, "more than 8 dimensions");
	refused("{'descr': '<f4', 'fortran_order': False, 'shape': (1048576, 1048576)}", 0,
		AP_ETOOLARGE, "more than 68719476736 elements");
	refused("{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999999,)}", 0,
		AP_ETOOLARGE, "over 68719476736");
	/* the data's size must be the header's: truncated, trailing */
	refused("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3)}", 20, AP_EINVAL,
		"need 24 data bytes, the file has 20 (the file is truncated?)");
	refused("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3)}", 28, AP_EINVAL,
		"need 24 data bytes, the file has 28");
}
END_TEST

START_TEST(npy_malformed_prefix_and_data)
{
	static const char ok[] = "{'descr': '|b1', 'fortran_order': False, 'shape': (3,)}";
	uint8_t bools[3] = { 0, 1, 2 };
	ap_host_tensor *t = NULL;
	ap_error err;
	size_t len;
	uint8_t *b = npy_bytes(1, ok, true, bools, 3, &len);

	/* a bool byte other than 0 or 1 */
	ck_assert_int_eq(ap_npy_decode(b, len, "t.npy", &t, &err), AP_EINVAL);
	ck_assert_ptr_nonnull(strstr(err.msg, "bool element 2 is the byte 2"));
	/* the magic; versions other than 1.0 and 2.0 */
	b[1] = 'n';
	ck_assert_int_eq(ap_npy_decode(b, len, "t.npy", &t, &err), AP_EINVAL);
	ck_assert_ptr_nonnull(strstr(err.msg, "t.npy: not a .npy file"));
	b[1] = 'N';
	b[6] = 3;
	ck_assert_int_eq(ap_npy_decode(b, len, "t.npy", &t, &err), AP_EUNSUPPORTED);
	ck_assert_ptr_nonnull(strstr(err.msg, "version 3.0"));
	b[6] = 1;
	b[7] = 1;
	ck_assert_int_eq(ap_npy_decode(b, len, "t.npy", &t, &err), AP_EUNSUPPORTED);
	b[7] = 0;
	/* a header length past the end; every prefix of the file */
	for (size_t cut = 0; cut < len; cut++) {
		int rc = ap_npy_decode(b, cut, "t.npy", &t, &err);

		ck_assert_int_lt(rc, 0);
		ck_assert_ptr_null(t);
		ck_assert_ptr_nonnull(strstr(err.msg, "t.npy"));
	}
	free(b);
	/* a header that does not end in a newline */
	b = npy_bytes(1, ok, false, bools, 2, &len);
	ck_assert_int_eq(ap_npy_decode(b, len, "t.npy", &t, &err), AP_EINVAL);
	ck_assert_ptr_nonnull(strstr(err.msg, "newline"));
	free(b);
	/* a version 2.0 header over 64 KiB is refused from its length alone */
	b = npy_bytes(2, ok, true, NULL, 0, &len);
	b[10] = 2;   /* header length 0x2____: over 128 KiB */
	ck_assert_int_eq(ap_npy_decode(b, len, "t.npy", &t, &err), AP_ETOOLARGE);
	free(b);
}
END_TEST

static const char *tmp_file(char *buf, size_t cap, const char *suffix)
{
	const char *dir = getenv("TMPDIR");

	snprintf(buf, cap, "%s/check_npy.%d.%s", dir && *dir ? dir : "/tmp", (int)getpid(), suffix);
	return buf;
}

START_TEST(npy_files)
{
	char path[512], pb[512];
	int32_t v[4] = { 7, -8, 9, 10 };
	ap_host_tensor in = { .name = "x", .dtype = AP_DT_I32, .rank = 2, .dims = { 2, 2 },
			      .data = v, .nbytes = sizeof(v) }, *t;
	ap_error err;
	uint8_t *buf;
	size_t len;
	FILE *f;

	tmp_file(path, sizeof(path), "npy");
	ck_assert_int_eq(ap_npy_write(path, &in, &err), 0);
	ck_assert_int_eq(ap_npy_read(path, "named", &t, &err), 0);
	ck_assert_str_eq(t->name, "named");
	ck_assert_mem_eq(t->data, v, sizeof(v));
	ap_host_tensor_free(t);
	ck_assert_int_eq(ap_tensor_file_read(path, "y", &t, &err), 0);
	ck_assert_str_eq(t->name, "y");
	ck_assert_int_eq(t->dims[1], 2);
	ap_host_tensor_free(t);
	/* truncated on disk: refused naming the file, before the data is read */
	ck_assert_int_eq(truncate(path, 128 + 8), 0);
	ck_assert_int_eq(ap_npy_read(path, NULL, &t, &err), AP_EINVAL);
	ck_assert_ptr_nonnull(strstr(err.msg, path));
	ck_assert_msg(strstr(err.msg, "need 16 data bytes, the file has 8"), "%s", err.msg);
	/* a header that claims 2^35 floats in a small file: no allocation of it */
	buf = npy_bytes(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (34359738368,)}",
			true, NULL, 16, &len);
	f = fopen(path, "wb");
	ck_assert_uint_eq(fwrite(buf, 1, len, f), len);
	fclose(f);
	free(buf);
	ck_assert_int_eq(ap_npy_read(path, NULL, &t, &err), AP_EINVAL);
	ck_assert_ptr_nonnull(strstr(err.msg, "need 137438953472 data bytes, the file has 16"));
	ck_assert_int_eq(ap_npy_read("/nonexistent/x.npy", NULL, &t, &err), AP_EIO);
	ck_assert_ptr_nonnull(strstr(err.msg, "/nonexistent/x.npy"));
	unlink(path);
	/* not .npy: a TensorProto */
	tmp_file(pb, sizeof(pb), "pb");
	ck_assert_int_eq(ap_testdata_encode(&in, NULL, &buf, &len, &err), 0);
	ck_assert_int_eq(ap_file_write(pb, buf, len, &err), 0);
	free(buf);
	ck_assert_int_eq(ap_tensor_file_read(pb, "z", &t, &err), 0);
	ck_assert_str_eq(t->name, "z");
	ck_assert_int_eq(t->dtype, AP_DT_I32);
	ck_assert_mem_eq(t->data, v, sizeof(v));
	ap_host_tensor_free(t);
	ck_assert_int_eq(truncate(pb, 3), 0);
	ck_assert_int_lt(ap_tensor_file_read(pb, "z", &t, &err), 0);
	ck_assert_ptr_nonnull(strstr(err.msg, pb));
	unlink(pb);
	/* what has no .npy type is not written */
	in.dtype = AP_DT_BF16;
	in.nbytes = 8;
	ck_assert_int_eq(ap_npy_encode(&in, &buf, &len, &err), AP_EUNSUPPORTED);
	in.dtype = AP_DT_I32;
	in.nbytes = 12;
	ck_assert_int_eq(ap_npy_encode(&in, &buf, &len, &err), AP_EINVAL);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("npy");
	TCase *tc = tcase_create("npy");
	SRunner *sr;
	int failed;

	tcase_add_test(tc, npy_round_trip_every_dtype);
	tcase_add_test(tc, npy_headers_as_written);
	tcase_add_test(tc, npy_malformed_headers);
	tcase_add_test(tc, npy_malformed_prefix_and_data);
	tcase_add_test(tc, npy_files);
	suite_add_tcase(s, tc);
	sr = srunner_create(s);
	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? 1 : 0;
}
