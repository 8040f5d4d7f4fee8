/* tmap.h -- tiled tensor maps (Hopper's TMA): what cuTensorMapEncodeTiled
 * accepts, and a host emulation of the tile load
 * cp.async.bulk.tensor.Nd.shared::cluster.global.tile (PTX ISA, "Tensor
 * Memory Accelerator" and "cp.async.bulk.tensor"; CUDA Driver API,
 * "Tensor Map Object Management").
 *
 * A tensor map describes a global tensor of rank 1..5 (dimension 0
 * innermost, contiguous) and the box a load copies; a load names the
 * box's first element by one signed 32-bit coordinate per dimension and
 * writes the box densely into shared memory, dimension 0 fastest,
 * swizzled by the map's mode.  Elements whose coordinates fall outside
 * the tensor are filled (zero, or NaN with the OOB NaN mode) and still
 * count: the load's complete-tx is the whole box's bytes.  The daemon
 * (kernel parameters), the client runtime (encoding through the driver)
 * and the host kernels (the emulated load) share this one description.
 */
#ifndef AP_TMAP_H
#define AP_TMAP_H

#include <stddef.h>
#include <stdint.h>

/* CUtensorMapDataType's values */
enum {
	AP_TMAP_UINT8 = 0, AP_TMAP_UINT16, AP_TMAP_UINT32, AP_TMAP_INT32, AP_TMAP_UINT64,
	AP_TMAP_INT64, AP_TMAP_FLOAT16, AP_TMAP_FLOAT32, AP_TMAP_FLOAT64, AP_TMAP_BFLOAT16,
	AP_TMAP_FLOAT32_FTZ, AP_TMAP_TFLOAT32, AP_TMAP_TFLOAT32_FTZ,
};
/* CUtensorMapInterleave, CUtensorMapSwizzle, CUtensorMapL2promotion and
 * CUtensorMapFloatOOBfill's values */
enum { AP_TMAP_INTERLEAVE_NONE = 0, AP_TMAP_INTERLEAVE_16B, AP_TMAP_INTERLEAVE_32B };
enum { AP_TMAP_SWIZZLE_NONE = 0, AP_TMAP_SWIZZLE_32B, AP_TMAP_SWIZZLE_64B, AP_TMAP_SWIZZLE_128B };
enum { AP_TMAP_L2_NONE = 0, AP_TMAP_L2_64B, AP_TMAP_L2_128B, AP_TMAP_L2_256B };
enum { AP_TMAP_OOB_ZERO = 0, AP_TMAP_OOB_NAN };

#define AP_TMAP_MAX_RANK 5

/* The arguments of cuTensorMapEncodeTiled but the map and the address,
 * with the driver's enums as ints. */
typedef struct ap_tmap_desc {
	int dtype;                          /* AP_TMAP_UINT8 .. AP_TMAP_TFLOAT32_FTZ */
	int rank;                           /* 1..5 */
	uint64_t dims[AP_TMAP_MAX_RANK];    /* elements, innermost first */
	uint64_t strides[AP_TMAP_MAX_RANK - 1]; /* bytes from one index of dimension
						   d + 1 to the next, d < rank - 1 */
	uint32_t box[AP_TMAP_MAX_RANK];     /* the box, elements per dimension */
	uint32_t estrides[AP_TMAP_MAX_RANK];/* element strides: a load takes every
					       estrides[d]-th element of the box
					       along d (dimension 0's is ignored
					       without interleave) */
	int interleave, swizzle, l2, oob;   /* AP_TMAP_INTERLEAVE_*, _SWIZZLE_*, _L2_*, _OOB_* */
} ap_tmap_desc;

/* Bytes of one element of tensor-map type dtype; 0 for a value that is
 * not one. */
size_t ap_tmap_elem_bytes(int dtype);

/* The tensor-map type holding elements of ONNX TensorProto.DataType
 * number `dt` (ap_dtype and apollo.DataType share the numbers: 1 float,
 * 2 uint8, 6 int32, 7 int64, 10 float16, 11 double, 16 bfloat16); -1 for
 * a type no map holds here. */
int ap_tmap_dtype_of(int dt);

/* The span of a swizzle mode in bytes (32, 64, 128; 0 for NONE or a bad
 * mode): a swizzled box's dimension-0 row must fit it, and the pattern
 * repeats every 8 spans (the destination's required alignment). */
unsigned ap_tmap_swizzle_span(int swizzle);

/* The swizzle mode whose span is `bytes` (32, 64 or 128), the inverse of
 * ap_tmap_swizzle_span; AP_TMAP_SWIZZLE_NONE for any other value. */
int ap_tmap_swizzle_of(unsigned bytes);

/* Whether cuTensorMapEncodeTiled accepts d with the tensor at `global`
 * (may be NULL: the address is not checked): 0, or -1 with the first
 * broken rule in why (cap bytes; why may be NULL), e.g. "strides[0] =
 * 100: a multiple of 16 bytes below 2^40".  The rules, per the Driver
 * API's reference of the function: rank 1..5, at least 3 with
 * interleave; address aligned to 16 bytes (32 with 32-byte interleave);
 * each dimension 1..2^32; strides multiples of 16 (32 with 32-byte
 * interleave) below 2^40; each box dimension 1..256, without interleave
 * dimension 0's box a multiple of 16 bytes; element strides 1..8; 32-byte
 * interleave only with the 32-byte swizzle; a swizzled box row (dimension
 * 0's box bytes, or the interleave's 16 / 32 bytes) at most the swizzle
 * span; the OOB NaN fill only for floating-point types. */
int ap_tmap_check(const ap_tmap_desc *d, const void *global, char *why, size_t cap);

/* Bytes one load of d writes to shared memory and counts in its
 * mbarrier's complete-tx: the product over dimensions of
 * ceil(box / element stride) elements (dimension 0's whole box without
 * interleave), times the element size. */
size_t ap_tmap_box_bytes(const ap_tmap_desc *d);

/* The host emulation of one tile load of d (checked: ap_tmap_check) from
 * the tensor at `global` at box coordinates coords[0 .. rank-1] (signed,
 * innermost first) into dst, dst_bytes long: element (i0, i1, ...) of the
 * loaded box, from tensor coordinates (coords[d] + i_d * estrides[d]),
 * goes to byte o = (i0 + n0 (i1 + n1 (...))) * element size of the dense
 * box (n_d: the elements loaded along d), then o ^ (((o >> 7) & (S/16 -
 * 1)) << 4) under a swizzle of span S -- the 16-byte chunk within each
 * 128-byte stretch XOR-ed with the stretch's index (CuTe's Swizzle<1..3,
 * 4, 3>; the hardware does it on the shared address, hence dst must be
 * aligned to 8 S, and to 128 bytes without swizzle).  An element with a
 * coordinate outside [0, dims[d]) is filled: zero, or with AP_TMAP_OOB_NAN
 * the type's all-ones quiet NaN (the hardware's pattern is not specified
 * beyond "NaN"; confirm on a device).  Reads only inside the tensor's
 * extent: global + sum (dims[d] - 1) stride_d + element size.  Returns
 * the bytes written (ap_tmap_box_bytes), or -1 with why: d refused by
 * ap_tmap_check, dst too small (swizzled: the box's bytes rounded up to
 * 128, the last stretch's chunks move too) or misaligned, or an interleaved layout
 * (not emulated: Apollo's maps have none). */
long long ap_tmap_load(const ap_tmap_desc *d, const void *global, const int32_t *coords, void *dst,
		       size_t dst_bytes, char *why, size_t cap);

#endif
