/* bundle.c -- the reply bundle (apollo.Bundle) built from a program and
 * its kernels' blobs, freed, and packed without its blobs for the cache;
 * and a warm answer's frame spliced from the stored bundle's bytes.
 *
 * Every protobuf message is allocated with malloc, field by field, exactly
 * as protobuf-c's unpacker would (see compile.c).
 *
 * The warm answer (issue 26, item 2) is the stored bundle's bytes, copied,
 * with each kernel's blob (or blob_of) and the request's stats put in: no
 * message is decoded but the small Stats, nothing is packed but it, and
 * each distinct blob is copied once, from the memory tier into the frame.
 */
#include "compile_internal.h"

#include "../../common/frame.h"
#include "../../common/pb_wire.h"

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

/* apollo.TensorMap of d; NULL (and *oom) when out of memory. */
static Apollo__TensorMap *tmap_pb(const ap_tmap_desc *d, bool *oom)
{
	Apollo__TensorMap *m = xcalloc(1, sizeof(*m), oom);
	size_t r = (size_t)d->rank;

	if (!m)
		return NULL;
	apollo__tensor_map__init(m);
	m->dtype = d->dtype;
	m->rank = (uint32_t)d->rank;
	m->interleave = d->interleave;
	m->swizzle = d->swizzle;
	m->l2_promotion = d->l2;
	m->oob_fill = d->oob;
	m->dims = xmemdup(d->dims, r * sizeof(uint64_t), oom);
	m->n_dims = m->dims ? r : 0;
	m->strides = r > 1 ? xmemdup(d->strides, (r - 1) * sizeof(uint64_t), oom) : NULL;
	m->n_strides = m->strides ? r - 1 : 0;
	m->box = xmemdup(d->box, r * sizeof(uint32_t), oom);
	m->n_box = m->box ? r : 0;
	m->element_strides = xmemdup(d->estrides, r * sizeof(uint32_t), oom);
	m->n_element_strides = m->element_strides ? r : 0;
	return m;
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
		if (ks->params[a].has_tmap)
			kp->tmap = tmap_pb(&ks->params[a].tmap, oom);
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

/* The apollo.LibraryCall of a launch a library computes (issue 25): the
 * kernel IR's call (server/kir/kir.h, params = the launch's args), with
 * what chose it (an ap_tune_kind); NULL when out of memory. */
static Apollo__LibraryCall *library_msg(const ap_kir_library *lib, int choice, bool *oom)
{
	static const char *const by[] = { "cost model", "tuning search (cost model)",
					   "tuning record (cost model)", "measured tuning record" };
	Apollo__LibraryCall *lc = xcalloc(1, sizeof(*lc), oom);

	if (!lc)
		return NULL;
	apollo__library_call__init(lc);
	lc->op = (Apollo__LibraryOp)lib->op;
	lc->a_type = (Apollo__DataType)lib->a_type;
	lc->b_type = (Apollo__DataType)lib->b_type;
	lc->c_type = (Apollo__DataType)lib->c_type;
	lc->d_type = (Apollo__DataType)lib->d_type;
	lc->bias_type = (Apollo__DataType)lib->bias_type;
	lc->compute = (Apollo__LibraryCompute)lib->compute;
	lc->m = (uint32_t)lib->m;
	lc->n = (uint32_t)lib->n;
	lc->k = (uint32_t)lib->k;
	lc->batch = (uint32_t)lib->batch;
	lc->stride_a = (uint64_t)lib->stride_a;
	lc->stride_b = (uint64_t)lib->stride_b;
	lc->stride_c = (uint64_t)lib->stride_c;
	lc->stride_d = (uint64_t)lib->stride_d;
	lc->lda = (uint32_t)lib->lda;
	lc->ldb = (uint32_t)lib->ldb;
	lc->ldc = (uint32_t)lib->ldc;
	lc->ldd = (uint32_t)lib->ldd;
	lc->trans_a = lib->trans_a;
	lc->trans_b = lib->trans_b;
	lc->epilogue = (Apollo__LibraryEpilogue)lib->epilogue;
	lc->alpha = lib->alpha;
	lc->beta = lib->beta;
	lc->a_arg = (uint32_t)lib->a;
	lc->b_arg = (uint32_t)lib->b;
	lc->c_arg = lib->c >= 0 ? (uint32_t)lib->c : 0;
	lc->d_arg = (uint32_t)lib->d;
	lc->bias_arg = lib->bias >= 0 ? (uint32_t)lib->bias : 0;
	lc->workspace_offset = (uint64_t)lib->workspace_offset;
	lc->workspace_bytes = (uint64_t)lib->workspace_bytes;
	lc->library_us = lib->library_us;
	lc->kernel_us = lib->kernel_us;
	lc->chosen_by = xstrdup(by[choice >= 0 && choice < 4 ? choice : 0], oom);
	return lc;
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
	if (l->library)
		pl->library = library_msg(l->library, l->library_choice, oom);
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

/* ---- a warm answer's frame, spliced (issue 26, item 2) ------------------- */

/* Field numbers and one-byte tags (number << 3 | wire type) of the fields
 * the splice writes (proto/apollo.proto). */
enum {
	ENVELOPE_ID = 1, ENVELOPE_COMPILED = 9, RESPONSE_BUNDLE = 1,
	BUNDLE_KERNELS = 3, BUNDLE_STATS = 7,
	KERNEL_BLOB = 4, KERNEL_DIGEST = 9, KERNEL_BLOB_OF = 11, KERNEL_LAST = 11,
};
#define TAG(number, wire) ((uint8_t)((number) << 3 | (wire)))

/* One kernel of the stored bundle on its way into the answer. */
struct warm_kernel {
	const uint8_t *p;          /* the stored Kernel's bytes */
	size_t n;
	size_t split;              /* where its blob goes: the first field after 4 */
	const uint8_t *digest;     /* 32 bytes, in p */
	uint32_t blob_of;          /* k + 1: kernel k carries its blob; or */
	ap_blob *blob;             /* its own, a reference */
	size_t out;                /* its bytes in the answer */
};

static size_t varint_len(uint64_t v)
{
	size_t n = 1;

	while (v >= 0x80) {
		v >>= 7;
		n++;
	}
	return n;
}

/* The bytes of a length-delimited field of `len` bytes with a one-byte tag. */
static size_t delimited_len(size_t len)
{
	return 1 + varint_len(len) + len;
}

/* Writes a one-byte tag and a varint at *w; advances it. */
static void put_tag_varint(uint8_t **w, uint8_t tag, uint64_t v)
{
	*(*w)++ = tag;
	*w += ap_pbw_put_varint(*w, v);
}

/* Reads stored Kernel `k` (k->p, k->n): its digest (field 9, 32 bytes,
 * once) and where its blob goes; false when the bytes are not what
 * ap__compile_pack_stripped writes (fields in order, numbers 1..11, no
 * blob, no blob_of). */
static bool warm_kernel_read(struct warm_kernel *k)
{
	ap_pbw r;
	ap_pbw_field f;
	uint32_t last = 0;
	int rc;

	k->split = k->n;
	k->digest = NULL;
	ap_pbw_init(&r, k->p, k->n);
	while ((rc = ap_pbw_next(&r, &f)) == 1) {
		if (f.number < last || f.number > KERNEL_LAST || f.number == KERNEL_BLOB ||
		    f.number == KERNEL_BLOB_OF)
			return false;
		if (f.number > KERNEL_BLOB && last < KERNEL_BLOB)
			k->split = (size_t)(f.start - k->p);
		if (f.number == KERNEL_DIGEST) {
			if (k->digest || f.wire != 2 || f.len != 32)
				return false;
			k->digest = f.data;
		}
		last = f.number;
	}
	return rc == 0 && k->digest;
}

/* Gives kernel i its blob: the kernel before it that carries the same
 * digest (blob_of), else a reference from the cache; its size in the
 * answer.  False when the blob is missing. */
static bool warm_kernel_blob(ap_cache *cache, struct warm_kernel *ks, size_t i)
{
	struct warm_kernel *k = &ks[i];
	size_t len;

	for (size_t j = 0; j < i && !k->blob_of; j++)
		if (!ks[j].blob_of && !memcmp(ks[j].digest, k->digest, 32))
			k->blob_of = (uint32_t)j + 1;
	if (k->blob_of) {
		k->out = k->n + 1 + varint_len(k->blob_of);
		return true;
	}
	if (ap_cache_blob_ref(cache, k->digest, &k->blob) != 1)
		return false;
	len = ap_blob_len(k->blob);
	k->out = k->n + (len ? delimited_len(len) : 0);   /* proto3: no empty bytes */
	return true;
}

/* Writes kernel k as the answer holds it: the stored fields with its blob
 * (field 4) or blob_of (field 11) put in their places. */
static void warm_kernel_write(uint8_t **w, const struct warm_kernel *k)
{
	put_tag_varint(w, TAG(BUNDLE_KERNELS, 2), k->out);
	memcpy(*w, k->p, k->split);
	*w += k->split;
	if (k->blob && ap_blob_len(k->blob)) {
		put_tag_varint(w, TAG(KERNEL_BLOB, 2), ap_blob_len(k->blob));
		memcpy(*w, ap_blob_data(k->blob), ap_blob_len(k->blob));
		*w += ap_blob_len(k->blob);
	}
	memcpy(*w, k->p + k->split, k->n - k->split);
	*w += k->n - k->split;
	if (k->blob_of)
		put_tag_varint(w, TAG(KERNEL_BLOB_OF, 0), k->blob_of);
}

/* The stored bundle's top-level fields, read once: its kernels (each with
 * its blob), its stats (field 7; NULL when it has none) and the answer's
 * bundle size without the stats.  False when they are not in order, a
 * kernel does not read, or a blob is missing. */
static bool warm_read(ap_cache *cache, const uint8_t *val, size_t n, struct warm_kernel **ksp,
		      size_t *nk, const ap_pbw_field **statsp, ap_pbw_field *stats, size_t *rest)
{
	ap_pbw r;
	ap_pbw_field f;
	uint32_t last = 0;
	size_t cap = 0;
	int rc;

	*ksp = NULL;
	*nk = *rest = 0;
	*statsp = NULL;
	ap_pbw_init(&r, val, n);
	while ((rc = ap_pbw_next(&r, &f)) == 1) {
		if (f.number < last || (f.number == BUNDLE_STATS && *statsp) ||
		    ((f.number == BUNDLE_KERNELS || f.number == BUNDLE_STATS) && f.wire != 2) ||
		    f.number > 15)
			return false;
		last = f.number;
		if (f.number == BUNDLE_STATS) {
			*stats = f;
			*statsp = stats;
			continue;
		}
		if (f.number != BUNDLE_KERNELS) {
			*rest += (size_t)(f.end - f.start);
			continue;
		}
		if (*nk == cap) {
			struct warm_kernel *g = realloc(*ksp, (cap = cap ? 2 * cap : 64) * sizeof(*g));

			if (!g)
				return false;
			*ksp = g;
		}
		(*ksp)[*nk] = (struct warm_kernel){ .p = f.data, .n = f.len };
		if (!warm_kernel_read(&(*ksp)[*nk]) || !warm_kernel_blob(cache, *ksp, (*nk)++))
			return false;
		*rest += delimited_len((*ksp)[*nk - 1].out);
	}
	return rc == 0;
}

/* The answer's stats: the stored ones (a Stats of its own when there are
 * none) with this request's changes; packed, malloc'd.  NULL when they
 * do not decode or memory runs out. */
static uint8_t *warm_stats(const ap_pbw_field *stored, void (*set)(Apollo__Stats *, void *),
			   void *user, size_t *len)
{
	Apollo__Stats *st, fresh = APOLLO__STATS__INIT;
	uint8_t *out;

	st = stored ? apollo__stats__unpack(NULL, stored->len, stored->data) : &fresh;
	if (!st)
		return NULL;
	set(st, user);
	*len = apollo__stats__get_packed_size(st);
	out = malloc(*len ? *len : 1);
	if (out)
		apollo__stats__pack(st, out);
	if (st != &fresh)
		apollo__stats__free_unpacked(st, NULL);
	return out;
}

/* Writes the answer's frame at w (its size computed by the caller). */
static void warm_write(uint8_t *w, const uint8_t *val, size_t n, const struct warm_kernel *ks,
		       const uint8_t *stats, size_t stats_len, uint64_t id, size_t bundle,
		       size_t envelope)
{
	size_t response = delimited_len(bundle), k = 0;
	bool stats_done = false;
	ap_pbw r;
	ap_pbw_field f;

	ap_frame_put_len(w, (uint32_t)envelope);
	w += AP_FRAME_HEADER_BYTES;
	if (id)
		put_tag_varint(&w, TAG(ENVELOPE_ID, 0), id);
	put_tag_varint(&w, TAG(ENVELOPE_COMPILED, 2), response);
	put_tag_varint(&w, TAG(RESPONSE_BUNDLE, 2), bundle);
	ap_pbw_init(&r, val, n);
	while (ap_pbw_next(&r, &f) == 1) {
		if (f.number >= BUNDLE_STATS && !stats_done) {
			put_tag_varint(&w, TAG(BUNDLE_STATS, 2), stats_len);
			memcpy(w, stats, stats_len);
			w += stats_len;
			stats_done = true;
		}
		if (f.number == BUNDLE_STATS)
			continue;
		if (f.number == BUNDLE_KERNELS) {
			warm_kernel_write(&w, &ks[k++]);
			continue;
		}
		memcpy(w, f.start, (size_t)(f.end - f.start));
		w += f.end - f.start;
	}
	if (!stats_done) {
		put_tag_varint(&w, TAG(BUNDLE_STATS, 2), stats_len);
		memcpy(w, stats, stats_len);
	}
}

/* The frame of a warm answer (issue 26, item 2), assembled from the bytes
 * of the stored bundle `val` (n bytes, as ap__compile_pack_stripped wrote
 * them) without decoding it into messages: a frame (common/frame.h: the
 * 4-byte length, then an Envelope {id, compiled = CompileResponse
 * {bundle}}), malloc'd, *len bytes.  The bundle is the stored one with
 * each kernel's blob put back -- each distinct digest fetched once from
 * `cache` by reference (ap_cache_blob_ref) and copied once, into the
 * frame; a later kernel of the same digest gets blob_of instead, as
 * compile.c's share_blobs gives it -- and its stats those stored, changed
 * by set(stats, user).  Byte for byte what packing the decoded bundle would
 * give: protobuf-c writes a message's fields in the order of their numbers,
 * so each field put back goes before the first one numbered above it.
 * NULL when a blob is missing, the bytes are not a stored bundle's, or
 * memory runs out: the caller answers by decoding. */
uint8_t *ap__compile_warm_frame(ap_cache *cache, const uint8_t *val, size_t n, uint64_t id,
				void (*set)(Apollo__Stats *, void *), void *user, size_t *len)
{
	struct warm_kernel *ks = NULL;
	ap_pbw_field stats_field;
	const ap_pbw_field *stored = NULL;
	size_t nk = 0, rest = 0, stats_len = 0, bundle, envelope;
	uint8_t *stats = NULL, *out = NULL;

	if (!warm_read(cache, val, n, &ks, &nk, &stored, &stats_field, &rest) ||
	    !(stats = warm_stats(stored, set, user, &stats_len)))
		goto done;
	bundle = rest + delimited_len(stats_len);
	envelope = (id ? 1 + varint_len(id) : 0) + delimited_len(delimited_len(bundle));
	if (envelope > UINT32_MAX || !(out = malloc(AP_FRAME_HEADER_BYTES + envelope)))
		goto done;
	warm_write(out, val, n, ks, stats, stats_len, id, bundle, envelope);
	*len = AP_FRAME_HEADER_BYTES + envelope;
done:
	for (size_t i = 0; i < nk; i++)
		ap_blob_release(ks[i].blob);
	free(ks);
	free(stats);
	return out;
}
