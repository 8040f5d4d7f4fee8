/* seeds.c -- writes the fuzzers' seed corpora from ../shared/testdata
 * (run by tests/fuzz/make-seeds.sh; bundles come from a real apollod
 * there).
 *
 *   fuzz-seeds TESTDATA OUTDIR
 *
 * For every backend-test folder (category/name/model.onnx) whose model is
 * at most MAX_SEED bytes: OUTDIR/onnx/NAME (the model), OUTDIR/tensor/NAME-K
 * (its test_data_set_0 .pb files), and when it imports without bindings
 * OUTDIR/envelope/NAME (one frame: Envelope { compile { graph } }) and
 * OUTDIR/compile/NAME (the Envelope alone), plus OUTDIR/compile/NAME.onnx
 * (Envelope { compile { onnx_model } }, as --daemon-import sends it).
 */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "common/frame.h"
#include "common/graph.h"
#include "proto/apollo.pb-c.h"

#define MAX_SEED (64 * 1024)

static uint8_t *slurp(const char *path, size_t *len)
{
	FILE *f = fopen(path, "rb");
	uint8_t *buf;
	long n;

	if (!f)
		return NULL;
	fseek(f, 0, SEEK_END);
	n = ftell(f);
	fseek(f, 0, SEEK_SET);
	if (n < 0 || n > MAX_SEED || !(buf = malloc((size_t)n + 1))) {
		fclose(f);
		return NULL;
	}
	if (fread(buf, 1, (size_t)n, f) != (size_t)n) {
		fclose(f);
		free(buf);
		return NULL;
	}
	fclose(f);
	*len = (size_t)n;
	return buf;
}

static void spit(const char *dir, const char *kind, const char *name, const uint8_t *p,
		 size_t n)
{
	char path[8192];
	FILE *f;

	snprintf(path, sizeof(path), "%s/%s/%s", dir, kind, name);
	f = fopen(path, "wb");
	if (!f || fwrite(p, 1, n, f) != n) {
		perror(path);
		exit(1);
	}
	fclose(f);
}

/* Packs a CompileRequest in an Envelope; with `framed` a length prefix. */
static uint8_t *envelope(Apollo__CompileRequest *req, bool framed, size_t *len)
{
	Apollo__Envelope env = APOLLO__ENVELOPE__INIT;
	size_t n, off = framed ? AP_FRAME_HEADER_BYTES : 0;
	uint8_t *buf;

	env.id = 1;
	env.msg_case = APOLLO__ENVELOPE__MSG_COMPILE;
	env.compile = req;
	n = apollo__envelope__get_packed_size(&env);
	buf = malloc(n + off);
	if (!buf)
		exit(1);
	apollo__envelope__pack(&env, buf + off);
	if (framed)
		ap_frame_put_len(buf, (uint32_t)n);
	*len = n + off;
	return buf;
}

static void one_model(const char *out, const char *dir, const char *name)
{
	char path[8192];
	size_t len = 0, n;
	uint8_t *model, *buf;
	ap_error err;
	ap_graph *g;
	Apollo__CompileRequest req = APOLLO__COMPILE_REQUEST__INIT;

	snprintf(path, sizeof(path), "%s/model.onnx", dir);
	model = slurp(path, &len);
	if (!model)
		return;
	spit(out, "onnx", name, model, len);
	for (int k = 0; k < 8; k++) {
		char tn[600];
		size_t tl;
		uint8_t *t;

		snprintf(path, sizeof(path), "%s/test_data_set_0/input_%d.pb", dir, k);
		if ((t = slurp(path, &tl))) {
			snprintf(tn, sizeof(tn), "%s-in%d", name, k);
			spit(out, "tensor", tn, t, tl);
			free(t);
		}
	}
	req.target = "cpu";
	req.source_case = APOLLO__COMPILE_REQUEST__SOURCE_ONNX_MODEL;
	req.onnx_model.data = model;
	req.onnx_model.len = len;
	buf = envelope(&req, false, &n);
	snprintf(path, sizeof(path), "%s.onnx", name);
	spit(out, "compile", path, buf, n);
	free(buf);
	g = ap_onnx_import(model, len, NULL, 0, NULL, &err);
	if (g) {
		Apollo__Graph *pb = ap_graph_to_pb(g);

		req.source_case = APOLLO__COMPILE_REQUEST__SOURCE_GRAPH;
		req.graph = pb;
		buf = envelope(&req, true, &n);
		if (n <= MAX_SEED) {
			spit(out, "envelope", name, buf, n);
			spit(out, "compile", name, buf + AP_FRAME_HEADER_BYTES, n - AP_FRAME_HEADER_BYTES);
		}
		free(buf);
		ap_graph_pb_free(pb);
		ap_graph_free(g);
	}
	free(model);
}

int main(int argc, char **argv)
{
	static const char *const cats[] = { "onnx-node", "onnx-simple", "onnx-light",
					    "onnx-pytorch-operator", "onnx-pytorch-converted",
					    "models", "training" };
	static const char *const kinds[] = { "onnx", "tensor", "envelope", "compile" };
	char path[4096];
	int n = 0;

	if (argc != 3) {
		fprintf(stderr, "usage: %s TESTDATA OUTDIR\n", argv[0]);
		return 2;
	}
	for (size_t k = 0; k < sizeof(kinds) / sizeof(kinds[0]); k++) {
		snprintf(path, sizeof(path), "%s/%s", argv[2], kinds[k]);
		mkdir(argv[2], 0755);
		mkdir(path, 0755);
	}
	for (size_t c = 0; c < sizeof(cats) / sizeof(cats[0]); c++) {
		DIR *d;
		struct dirent *de;

		snprintf(path, sizeof(path), "%s/%s", argv[1], cats[c]);
		if (!(d = opendir(path)))
			continue;
		while ((de = readdir(d))) {
			char dir[4096];

			if (de->d_name[0] == '.')
				continue;
			snprintf(dir, sizeof(dir), "%s/%s/%s", argv[1], cats[c], de->d_name);
			one_model(argv[2], dir, de->d_name);
			n++;
		}
		closedir(d);
	}
	printf("fuzz-seeds: %d test folders read from %s\n", n, argv[1]);
	return 0;
}
