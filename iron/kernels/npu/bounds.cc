// The emulator's side of the AIE API host header: the buffers the running kernel call was
// given, and the first access outside them.  Not part of a core's build.
#if !defined(__AIE_ARCH__)
#include <cstdint>
#include <cstdio>

#include "aie_api_host.h"

namespace {
constexpr int kMaxBuffers = 16;
const char *g_base[kMaxBuffers];
int64_t g_size[kMaxBuffers];
int32_t g_count = -1;  // -1: no bounds set (a direct call outside the emulator)
char g_message[256];
bool g_violated = false;
}  // namespace

extern "C" {
void iron_npu_set_bounds(int32_t n, const void *const *bases, const int64_t *sizes) {
    g_count = n < kMaxBuffers ? n : kMaxBuffers;
    for (int32_t i = 0; i < g_count; i++) {
        g_base[i] = static_cast<const char *>(bases[i]);
        g_size[i] = sizes[i];
    }
    g_violated = false;
    g_message[0] = 0;
}

const char *iron_npu_violation(void) { return g_violated ? g_message : nullptr; }

void iron_npu_check_access(const void *p, int64_t bytes, const char *what) {
    if (g_count < 0 || g_violated) return;
    const char *c = static_cast<const char *>(p);
    for (int32_t i = 0; i < g_count; i++)
        if (c >= g_base[i] && c + bytes <= g_base[i] + g_size[i]) return;
    g_violated = true;
    int32_t near = -1;  // the buffer starting closest below the access, else the lowest
    for (int32_t i = 0; i < g_count; i++)
        if (c >= g_base[i] && (near < 0 || g_base[i] > g_base[near])) near = i;
    if (near < 0)
        for (int32_t i = 0; i < g_count; i++)
            if (near < 0 || g_base[i] < g_base[near]) near = i;
    if (near < 0) {
        std::snprintf(g_message, sizeof g_message, "%s of %lld bytes with no buffer given", what,
                      (long long)bytes);
        return;
    }
    std::snprintf(g_message, sizeof g_message,
                  "%s of %lld bytes at byte %lld of buffer argument %d (%lld bytes long)", what,
                  (long long)bytes, (long long)(c - g_base[near]), (int)near,
                  (long long)g_size[near]);
}
}
#endif
