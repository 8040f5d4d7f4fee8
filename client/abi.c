/* abi.c -- ap_abi_sizeof: the size of each struct that a language binding
 * mirrors field by field (client/python/apollo/_lib.py, through ctypes).
 * A binding compares its own sizes with these when it loads the library,
 * and each field's name and offset with ap_abi_field's table, so a field
 * added on one side only is an import error that names the struct and
 * the field, never a read or a write past the end of a caller's buffer or
 * a value left in padding (a bool the binding lacked sat there once:
 * ap_submit_options.tma).
 */
#include "apollo.h"
#include "runtime.h"

#include <stddef.h>
#include <string.h>

size_t ap_abi_sizeof(const char *name)
{
	static const struct {
		const char *name;
		size_t size;
	} types[] = {
		{ "ap_error", sizeof(ap_error) },
		{ "ap_tensor", sizeof(ap_tensor) },
		{ "ap_graph", sizeof(ap_graph) },
		{ "ap_submit_options", sizeof(ap_submit_options) },
		{ "ap_device_info", sizeof(ap_device_info) },
		{ "ap_server_stats", sizeof(ap_server_stats) },
		{ "ap_bundle_stats", sizeof(ap_bundle_stats) },
		{ "ap_bundle_buffer", sizeof(ap_bundle_buffer) },
		{ "ap_runtime_options", sizeof(ap_runtime_options) },
		{ "ap_host_tensor", sizeof(ap_host_tensor) },
	};

	for (size_t i = 0; name && i < sizeof(types) / sizeof(types[0]); i++)
		if (!strcmp(types[i].name, name))
			return types[i].size;
	return 0;
}

/* Every field of each mirrored struct, in declaration order (a field
 * added to one of these structs goes here too: a size alone cannot see a
 * field that fits in padding, as a bool before an unsigned does). */
#define F(t, f) { #t, #f, offsetof(t, f) },
static const struct abi_field {
	const char *type, *field;
	size_t offset;
} fields[] = {
	F(ap_error, code) F(ap_error, msg) F(ap_error, node) F(ap_error, tensor)
	F(ap_tensor, name) F(ap_tensor, dtype) F(ap_tensor, rank) F(ap_tensor, dims) F(ap_tensor, kind)
	F(ap_tensor, data) F(ap_tensor, nbytes) F(ap_tensor, producer) F(ap_tensor, is_output)
	F(ap_graph, name) F(ap_graph, n_tensors) F(ap_graph, cap_tensors) F(ap_graph, tensors)
	F(ap_graph, n_nodes) F(ap_graph, cap_nodes) F(ap_graph, nodes) F(ap_graph, n_inputs)
	F(ap_graph, inputs) F(ap_graph, n_outputs) F(ap_graph, outputs) F(ap_graph, eager_kernels)
	F(ap_submit_options, target) F(ap_submit_options, output) F(ap_submit_options, no_cache)
	F(ap_submit_options, cache_namespace) F(ap_submit_options, max_block_threads)
	F(ap_submit_options, fusion) F(ap_submit_options, n_fusion_barriers)
	F(ap_submit_options, fusion_barriers) F(ap_submit_options, n_keep_whole)
	F(ap_submit_options, keep_whole) F(ap_submit_options, allow_tf32) F(ap_submit_options, no_layer1)
	F(ap_submit_options, no_tune) F(ap_submit_options, tma) F(ap_submit_options, tune_variant)
	F(ap_submit_options, device) F(ap_submit_options, host_check) F(ap_submit_options, unvalidated)
	F(ap_device_info, name) F(ap_device_info, sm_count) F(ap_device_info, cc_major)
	F(ap_device_info, cc_minor) F(ap_device_info, driver_version)
	F(ap_server_stats, requests) F(ap_server_stats, errors) F(ap_server_stats, cache_hits)
	F(ap_server_stats, cache_misses) F(ap_server_stats, kernels_compiled) F(ap_server_stats, cache_entries)
	F(ap_server_stats, cache_blob_bytes) F(ap_server_stats, clients) F(ap_server_stats, in_flight)
	F(ap_server_stats, uptime_s)
	F(ap_bundle_stats, kernels) F(ap_bundle_stats, eager_kernels) F(ap_bundle_stats, nodes)
	F(ap_bundle_stats, kernels_compiled) F(ap_bundle_stats, distinct_kernels) F(ap_bundle_stats, layer1)
	F(ap_bundle_stats, layer2) F(ap_bundle_stats, layer3) F(ap_bundle_stats, global_bytes)
	F(ap_bundle_stats, eager_bytes) F(ap_bundle_stats, min_bytes) F(ap_bundle_stats, import_ms)
	F(ap_bundle_stats, partition_ms) F(ap_bundle_stats, codegen_ms) F(ap_bundle_stats, backend_ms)
	F(ap_bundle_stats, cache_ms) F(ap_bundle_stats, compile_ms) F(ap_bundle_stats, cache_hit)
	F(ap_bundle_stats, cache_tier) F(ap_bundle_stats, kernels_remote) F(ap_bundle_stats, kernels_shared)
	F(ap_bundle_stats, layer1_ms) F(ap_bundle_stats, tune_hits) F(ap_bundle_stats, tune_measured)
	F(ap_bundle_stats, tune_searched) F(ap_bundle_stats, tune_tried) F(ap_bundle_stats, tune_ms)
	F(ap_bundle_stats, tune_capped) F(ap_bundle_stats, peak_bytes) F(ap_bundle_stats, input_bytes)
	F(ap_bundle_stats, output_bytes) F(ap_bundle_stats, const_bytes)
	F(ap_bundle_buffer, name) F(ap_bundle_buffer, kind) F(ap_bundle_buffer, dtype) F(ap_bundle_buffer, rank)
	F(ap_bundle_buffer, dims) F(ap_bundle_buffer, bytes) F(ap_bundle_buffer, offset) F(ap_bundle_buffer, index)
	F(ap_runtime_options, threads) F(ap_runtime_options, device) F(ap_runtime_options, external)
	F(ap_runtime_options, profile)
	F(ap_host_tensor, name) F(ap_host_tensor, dtype) F(ap_host_tensor, rank) F(ap_host_tensor, dims)
	F(ap_host_tensor, data) F(ap_host_tensor, nbytes)
};
#undef F

const char *ap_abi_field(const char *type, int i, size_t *offset)
{
	for (size_t j = 0; type && i >= 0 && j < sizeof(fields) / sizeof(fields[0]); j++)
		if (!strcmp(fields[j].type, type) && i-- == 0) {
			if (offset)
				*offset = fields[j].offset;
			return fields[j].field;
		}
	return NULL;
}
