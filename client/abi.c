/* abi.c -- ap_abi_sizeof: the size of each struct that a language binding
 * mirrors field by field (client/python/apollo/_lib.py, through ctypes).
 * A binding compares its own sizes with these when it loads the library,
 * so a field added on one side only is an import error that names the
 * struct, never a read or a write past the end of a caller's buffer.
 */
#include "apollo.h"
#include "runtime.h"

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
