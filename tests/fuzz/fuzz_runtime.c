/* fuzz_runtime.c -- libFuzzer harness: the runtime's bundle checks against
 * real bundles whose buffer tables are mutated (issue 29, item 4).
 *
 * At start it reads real target-cpu bundles compiled in the checking mode
 * (seeds/checked-bundle beside the executable, or $APOLLO_FUZZ_BUNDLES;
 * make-seeds.sh makes them), whose kernels and digests are genuine.  Each input is a list of 12-byte edits
 * -- which bundle, which field (a buffer's dim, bytes, offset, kind, rank or
 * dtype; a launch's argument, its per-argument bytes; the workspace size),
 * which element, the new value -- applied to a fresh copy of that bundle.
 * The copy goes through ap_runtime_new, and when it is taken it runs once
 * with zeroed inputs, every block of every kernel checked
 * (client/hostcheck.c): any edit the runtime's checks let through that
 * makes a kernel touch memory outside its buffers is reported by the
 * checker, and the harness aborts on it -- a finding.  The kernels themselves are never edited: a
 * self-consistent blob is native code by design. */
#include <dirent.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "client/apollo.h"
#include "client/runtime.h"
#include "proto/apollo.pb-c.h"

#define MAX_BUNDLES 16

static uint8_t *bundles[MAX_BUNDLES];
static size_t lens[MAX_BUNDLES];
static int n_bundles;

static void load_dir(const char *dir)
{
	DIR *d = opendir(dir);
	struct dirent *e;

	while (d && (e = readdir(d)) && n_bundles < MAX_BUNDLES) {
		char path[PATH_MAX];
		FILE *f;
		long n;

		if (e->d_name[0] == '.')
			continue;
		snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
		if (!(f = fopen(path, "rb")))
			continue;
		fseek(f, 0, SEEK_END);
		n = ftell(f);
		fseek(f, 0, SEEK_SET);
		if (n > 0 && n < (64 << 20) && (bundles[n_bundles] = malloc((size_t)n)) &&
		    fread(bundles[n_bundles], 1, (size_t)n, f) == (size_t)n)
			lens[n_bundles++] = (size_t)n;
		fclose(f);
	}
	if (d)
		closedir(d);
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	const char *env = getenv("APOLLO_FUZZ_BUNDLES");
	char exe[PATH_MAX], dir[PATH_MAX + 32];
	ssize_t n;

	(void)argc;
	(void)argv;
	if (env && *env) {
		load_dir(env);
	} else if ((n = readlink("/proc/self/exe", exe, sizeof(exe) - 1)) > 0) {
		char *slash;

		exe[n] = '\0';
		if ((slash = strrchr(exe, '/')))
			*slash = '\0';
		snprintf(dir, sizeof(dir), "%s/seeds/checked-bundle", exe);
		load_dir(dir);
	}
	if (!n_bundles)
		fprintf(stderr, "fuzz_runtime: no bundle under seeds/checked-bundle or "
			"$APOLLO_FUZZ_BUNDLES\n");
	setenv("APOLLO_HOSTCHECK_ALL_BLOCKS", "1", 1);
	return 0;
}

/* One edit: field f of element i (buffer or launch j, its slot k) := v. */
static void edit(Apollo__Bundle *b, uint8_t f, uint8_t j, uint8_t k, uint64_t v)
{
	Apollo__Buffer *bf = b->n_buffers ? b->buffers[j % b->n_buffers] : NULL;
	Apollo__Launch *la = b->n_plan ? b->plan[j % b->n_plan] : NULL;

	switch (f % 9) {
	case 0:
		if (bf && bf->n_dims)
			bf->dims[k % bf->n_dims] = (int64_t)v;
		break;
	case 1:
		if (bf)
			bf->bytes = v;
		break;
	case 2:
		if (bf)
			bf->offset = v;
		break;
	case 3:
		if (bf)
			bf->kind = (Apollo__BufferKind)(v % 6);
		break;
	case 4:
		if (bf && bf->n_dims)
			bf->n_dims = (size_t)(v % (bf->n_dims + 1));
		break;
	case 5:
		if (bf)
			bf->dtype = (Apollo__DataType)(v % 17);
		break;
	case 6:
		if (la && la->n_args)
			la->args[k % la->n_args] = (uint32_t)v;
		break;
	case 7:
		if (la && la->n_arg_bytes)
			la->arg_bytes[k % la->n_arg_bytes] = v;
		break;
	default:
		b->workspace_bytes = v;
		break;
	}
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	Apollo__Bundle *b;
	ap_bundle *ab;
	ap_runtime *rt;
	ap_error err;
	uint8_t *buf;
	size_t n;

	if (!n_bundles || size < 1)
		return 0;
	b = apollo__bundle__unpack(NULL, lens[data[0] % n_bundles], bundles[data[0] % n_bundles]);
	if (!b)
		return 0;
	for (size_t i = 1; i + 12 <= size; i += 12) {
		uint64_t v;

		memcpy(&v, data + i + 4, 8);
		edit(b, data[i], data[i + 1], data[i + 2], v);
	}
	n = apollo__bundle__get_packed_size(b);
	buf = malloc(n ? n : 1);
	if (buf)
		apollo__bundle__pack(b, buf);
	apollo__bundle__free_unpacked(b, NULL);
	if (!buf)
		return 0;
	ab = ap_bundle_unpack(buf, n, &err);
	free(buf);
	if (!ab)
		return 0;
	rt = ap_runtime_new(ab, NULL, &err);
	if (rt && ap_runtime_bind_zeros(rt, &err) == 0 && ap_runtime_run(rt, &err) < 0 &&
	    strstr(err.msg, "the checking mode found")) {
		/* a bundle the checks took made a kernel leave its memory */
		fprintf(stderr, "fuzz_runtime: %s\n", err.msg);
		abort();
	}
	ap_runtime_free(rt);
	ap_bundle_free(ab);
	return 0;
}
