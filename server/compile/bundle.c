/* bundle.c -- the reply bundle (apollo.Bundle) built from a program and
 * its kernels' blobs, freed, and packed without its blobs for the cache.
 *
 * Every protobuf message is allocated with malloc, field by field, exactly
 * as protobuf-c's unpacker would (see compile.c).
 */
#include "compile_internal.h"

/* ---- protobuf building ---------------------------------------------------- */

/* Allocation helpers that record a failure in *oom instead of returning it,
 * so the builder below reads straight and checks once. */
static void *xcalloc(size_t n, size_t size, bool *oom)
{
	void *p = calloc(n ? n : 1, size);

	if (!p)
		*oom = true;
	return p;
}

static char *xstrdup(const char *s, bool *oom)
{
	char *p = ap_strdup(s);

	if (!p)
		*oom = true;
	return p;
}

static void *xmemdup(const void *src, size_t n, bool *oom)
{
	void *p = malloc(n ? n : 1);

	if (!p)
		*oom = true;
	else if (n)
		memcpy(p, src, n);
	return p;
}

/* The names ("I", "II", "III") of the fusion layers in `layers`
 * (AP_LAYER_* bits), malloc'd; *n gets the count. */
static char **layer_names(unsigned layers, size_t *n, bool *oom)
{
	static const char *const names[] = {"I", "II", "III"};
	char **v = xcalloc(3, sizeof(char *), oom);

	*n = 0;
	for (int i = 0; v && i < 3; i++)
		if (layers & (1u << i)) {
			v[*n] = xstrdup(names[i], oom);
			if (!v[*n])
				break;
			(*n)++;
		}
	return v;
}

/* A copy of n strings (malloc'd array and strings): *n_out counts the
 * copies made before a failure, which sets *oom. */
static char **strs_dup(char *const *src, int n, size_t *n_out, bool *oom)
{
	char **v = xcalloc((size_t)n, sizeof(char *), oom);

	*n_out = 0;
	for (int a = 0; v && a < n; a++) {
		v[a] = xstrdup(src[a], oom);
		if (!v[a])
			break;
		*n_out = (size_t)a + 1;
	}
	return v;
}

/* One apollo.Kernel from kernel `ks` and its blob (taken: blob->data
 * belongs to the message afterwards); NULL when out of memory. */
static Apollo__Kernel *kernel_msg(const ap_kernel_src *ks, struct kblob *blob, const char *target,
				  int output, bool *oom)
{
	Apollo__Kernel *k = xcalloc(1, sizeof(*k), oom);

	if (!k)
		return NULL;
	apollo__kernel__init(k);
	k->name = xstrdup(ks->name, oom);
	k->target = xstrdup(target, oom);
	k->format = (Apollo__OutputKind)output;
	k->blob.data = blob->data;
	k->blob.len = blob->len;
	blob->data = NULL;
	k->digest.data = xmemdup(blob->digest, 32, oom);
	k->digest.len = k->digest.data ? 32 : 0;
	k->grid = xcalloc(3, sizeof(uint32_t), oom);
	k->block = xcalloc(3, sizeof(uint32_t), oom);
	if (k->grid && k->block) {
		k->n_grid = k->n_block = 3;
		for (int d = 0; d < 3; d++) {
			k->grid[d] = ks->grid[d];
			k->block[d] = ks->block[d];
		}
	}
	k->dynamic_shared_bytes = ks->smem_bytes;
	k->params = xcalloc((size_t)ks->n_params, sizeof(*k->params), oom);
	for (int a = 0; k->params && a < ks->n_params; a++) {
		Apollo__KernelParam *kp = xcalloc(1, sizeof(*kp), oom);
		if (!kp)
			break;
		apollo__kernel_param__init(kp);
		k->params[a] = kp;
		k->n_params = (size_t)a + 1;
		kp->name = xstrdup(ks->params[a].name, oom);
		kp->dtype = (Apollo__DataType)ks->params[a].dtype;
		kp->written = ks->params[a].written;
	}
	k->nodes = strs_dup(ks->nodes, ks->n_nodes, &k->n_nodes, oom);
	return k;
}

/* One apollo.LaunchPart (a horizontally fused part of a launch); NULL when
 * out of memory. */
static Apollo__LaunchPart *part_msg(const ap_launch_part *pt, bool *oom)
{
	Apollo__LaunchPart *pp = xcalloc(1, sizeof(*pp), oom);

	if (!pp)
		return NULL;
	apollo__launch_part__init(pp);
	pp->category = xstrdup(pt->category ? pt->category : "", oom);
	pp->block_begin = pt->block_begin;
	pp->blocks = pt->blocks;
	pp->detail = xstrdup(pt->detail ? pt->detail : "", oom);
	pp->emitter = xstrdup(pt->emitter ? pt->emitter : "", oom);
	pp->schedule = xstrdup(pt->schedule ? pt->schedule : "", oom);
	pp->recompute_ratio = pt->recompute;
	pp->layer1_schedule = xstrdup(pt->layer1 ? pt->layer1 : "", oom);
	if (pt->tuned) {
		pp->tune_signature.data = xmemdup(pt->tune_sig, 32, oom);
		pp->tune_signature.len = pp->tune_signature.data ? 32 : 0;
	}
	pp->layers = layer_names(pt->layers, &pp->n_layers, oom);
	pp->nodes = strs_dup(pt->nodes, pt->n_nodes, &pp->n_nodes, oom);
	return pp;
}

/* One apollo.Launch of the launch plan: its kernel, arguments (buffer
 * indices) with the bytes each may touch, nodes, category, parts; NULL
 * when out of memory. */
static Apollo__Launch *launch_msg(const ap_program *p, const ap_launch *l, bool *oom)
{
	Apollo__Launch *pl = xcalloc(1, sizeof(*pl), oom);

	if (!pl)
		return NULL;
	apollo__launch__init(pl);
	pl->kernel = (uint32_t)l->kernel;
	pl->args = xcalloc((size_t)l->n_args, sizeof(uint32_t), oom);
	pl->arg_bytes = xcalloc((size_t)l->n_args, sizeof(uint64_t), oom);
	if (pl->args && pl->arg_bytes) {
		/* each kernel parameter addresses its tensor whole: what the
		 * kernel may touch is that buffer's bytes (the runtime checks
		 * every bound buffer against it) */
		pl->n_args = pl->n_arg_bytes = (size_t)l->n_args;
		for (int a = 0; a < l->n_args; a++) {
			pl->args[a] = (uint32_t)l->args[a];
			pl->arg_bytes[a] = p->buffers[l->args[a]].nbytes;
		}
	}
	/* The imported nodes this launch computes and its micro-graph's
	 * kind (a kernel may be shared by several launches). */
	pl->nodes = strs_dup(l->nodes, l->n_nodes, &pl->n_nodes, oom);
	if (l->category)
		pl->category = xstrdup(l->category, oom);
	pl->global_bytes = l->global_bytes;
	pl->layers = layer_names(l->layers, &pl->n_layers, oom);
	pl->parts = xcalloc((size_t)l->n_parts, sizeof(*pl->parts), oom);
	for (int j = 0; pl->parts && j < l->n_parts; j++) {
		if (!(pl->parts[j] = part_msg(&l->parts[j], oom)))
			break;
		pl->n_parts = (size_t)j + 1;
	}
	return pl;
}

/* One apollo.Boundary: why two launches were not fused (--explain); NULL
 * when out of memory. */
static Apollo__Boundary *boundary_msg(const ap_program_boundary *pb, bool *oom)
{
	Apollo__Boundary *bd = xcalloc(1, sizeof(*bd), oom);

	if (!bd)
		return NULL;
	apollo__boundary__init(bd);
	bd->producer = (uint32_t)pb->producer;
	bd->consumer = (uint32_t)pb->consumer;
	bd->tensor = xstrdup(pb->tensor ? pb->tensor : "", oom);
	bd->reason = xstrdup(pb->reason ? pb->reason : "", oom);
	bd->detail = xstrdup(pb->detail ? pb->detail : "", oom);
	return bd;
}

/* One apollo.Buffer: a tensor of the launch plan (input, output, constant
 * with its bytes, or workspace at its offset); NULL when out of memory. */
static Apollo__Buffer *buffer_msg(const ap_buffer *bs, bool *oom)
{
	Apollo__Buffer *bb = xcalloc(1, sizeof(*bb), oom);

	if (!bb)
		return NULL;
	apollo__buffer__init(bb);
	bb->name = xstrdup(bs->name, oom);
	bb->kind = (Apollo__BufferKind)bs->kind;
	bb->dtype = (Apollo__DataType)bs->dtype;
	bb->dims = xcalloc((size_t)bs->rank, sizeof(int64_t), oom);
	if (bb->dims) {
		bb->n_dims = (size_t)bs->rank;
		memcpy(bb->dims, bs->dims, (size_t)bs->rank * sizeof(int64_t));
	}
	bb->bytes = bs->nbytes;
	bb->offset = bs->offset;
	bb->index = bs->index;
	if (bs->kind == AP_BUF_CONST && bs->data) {
		bb->data.data = xmemdup(bs->data, (size_t)bs->nbytes, oom);
		bb->data.len = bb->data.data ? (size_t)bs->nbytes : 0;
	}
	return bb;
}

/* Builds the bundle from the program and the blobs (taken: every
 * blobs[i].data is owned by the bundle, or freed, afterwards). */
Apollo__Bundle *ap__compile_build_bundle(const ap_program *p, struct kblob *blobs, const char *target,
				    int output, const uint8_t graph_hash[32], bool *oom)
{
	Apollo__Bundle *b = xcalloc(1, sizeof(*b), oom);
	int i;

	if (!b) {
		for (i = 0; i < p->n_kernels; i++)
			free(blobs[i].data), blobs[i].data = NULL;
		return NULL;
	}
	apollo__bundle__init(b);
	b->target = xstrdup(target, oom);
	b->format = (Apollo__OutputKind)output;
	b->kernels = xcalloc((size_t)p->n_kernels, sizeof(*b->kernels), oom);
	for (i = 0; b->kernels && i < p->n_kernels; i++) {
		if (!(b->kernels[i] = kernel_msg(&p->kernels[i], &blobs[i], target, output, oom)))
			break;
		b->n_kernels = (size_t)i + 1;
	}
	for (; i < p->n_kernels; i++)
		free(blobs[i].data), blobs[i].data = NULL;
	b->plan = xcalloc((size_t)p->n_launches, sizeof(*b->plan), oom);
	for (i = 0; b->plan && i < p->n_launches; i++) {
		if (!(b->plan[i] = launch_msg(p, &p->launches[i], oom)))
			break;
		b->n_plan = (size_t)i + 1;
	}
	b->boundaries = xcalloc((size_t)p->n_boundaries, sizeof(*b->boundaries), oom);
	for (i = 0; b->boundaries && i < p->n_boundaries; i++) {
		if (!(b->boundaries[i] = boundary_msg(&p->boundaries[i], oom)))
			break;
		b->n_boundaries = (size_t)i + 1;
	}
	b->buffers = xcalloc((size_t)p->n_buffers, sizeof(*b->buffers), oom);
	for (i = 0; b->buffers && i < p->n_buffers; i++) {
		if (!(b->buffers[i] = buffer_msg(&p->buffers[i], oom)))
			break;
		b->n_buffers = (size_t)i + 1;
	}
	b->workspace_bytes = p->workspace_bytes;
	b->graph_hash.data = xmemdup(graph_hash, 32, oom);
	b->graph_hash.len = b->graph_hash.data ? 32 : 0;
	b->stats = xcalloc(1, sizeof(*b->stats), oom);
	if (b->stats)
		apollo__stats__init(b->stats);
	return b;
}

Apollo__Bundle *ap__compile_bundle_free(Apollo__Bundle *b)
{
	if (b)
		apollo__bundle__free_unpacked(b, NULL);
	return NULL;
}

/* Frees a bundle whose kernels borrow blobs (`refs`, n of them; a bundle
 * from the cache, compile.c's from_cache): each borrowed pointer is taken
 * out of its kernel first, so that the bundle frees only what it owns,
 * then the references are given back and `refs` freed.  `b` and `refs`
 * may be NULL.  Returns NULL. */
Apollo__Bundle *ap__compile_bundle_release(Apollo__Bundle *b, struct blob_ref *refs, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		if (b && refs[i].kernel < b->n_kernels) {
			b->kernels[refs[i].kernel]->blob.data = NULL;
			b->kernels[refs[i].kernel]->blob.len = 0;
		}
		ap_blob_release(refs[i].blob);
	}
	free(refs);
	return ap__compile_bundle_free(b);
}

/* The kernel before kernel `i` of `b` that carries the blob kernel i's
 * digest names (the first with a blob of its own -- blob_of 0 -- and the
 * same 32-byte digest), as Kernel.blob_of counts it: its index + 1; 0 when
 * there is none (kernel i carries its own).  Kernels compiled as one
 * program share one blob, so a bundle carries each distinct blob once. */
uint32_t ap__compile_blob_owner(const Apollo__Bundle *b, size_t i)
{
	const Apollo__Kernel *k = b->kernels[i];

	if (k->digest.len != 32)
		return 0;
	for (size_t j = 0; j < i; j++) {
		const Apollo__Kernel *o = b->kernels[j];

		if (!o->blob_of && o->digest.len == 32 && !memcmp(o->digest.data, k->digest.data, 32))
			return (uint32_t)j + 1;
	}
	return 0;
}

/* Serializes `b` with every kernel blob left out (digests kept, blob_of
 * cleared: the stored bundle names each kernel's blob by digest only):
 * what the action cache stores.  NULL when out of memory. */
uint8_t *ap__compile_pack_stripped(Apollo__Bundle *b, size_t *len)
{
	ProtobufCBinaryData *saved = calloc(b->n_kernels ? b->n_kernels : 1, sizeof(*saved));
	uint32_t *of = calloc(b->n_kernels ? b->n_kernels : 1, sizeof(*of));
	uint8_t *out = NULL;

	if (!saved || !of) {
		free(saved);
		free(of);
		return NULL;
	}
	for (size_t i = 0; i < b->n_kernels; i++) {
		saved[i] = b->kernels[i]->blob;
		of[i] = b->kernels[i]->blob_of;
		b->kernels[i]->blob.data = NULL;
		b->kernels[i]->blob.len = 0;
		b->kernels[i]->blob_of = 0;
	}
	*len = apollo__bundle__get_packed_size(b);
	out = malloc(*len ? *len : 1);
	if (out)
		apollo__bundle__pack(b, out);
	for (size_t i = 0; i < b->n_kernels; i++) {
		b->kernels[i]->blob = saved[i];
		b->kernels[i]->blob_of = of[i];
	}
	free(saved);
	free(of);
	return out;
}
