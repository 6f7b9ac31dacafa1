/* __shfl_down_sync on 64-bit values for the emulator (tests/gpu/emu/emu.h
 * has the 32-bit xor shuffle only): two 32-bit exchanges through the
 * warp's buffer, each between two warp barriers; a lane whose source is
 * past the warp keeps its own value, as on the hardware. Included ahead of
 * kernels/fingerprint.cu by emu_fingerprint.sh. */
#pragma once
#include "emu.h"

inline uint32_t emu_shfl_down32(uint32_t v, unsigned delta)
{
    unsigned t = emu().cur->tid, lane = (t & 31u) + delta;
    emu().xbuf[t] = v;
    emu_wait(EMU_WARP_BAR);
    uint32_t r = lane < 32 ? emu().xbuf[(t & ~31u) | lane] : v;
    emu_wait(EMU_WARP_BAR);
    return r;
}

inline uint64_t __shfl_down_sync(unsigned mask, uint64_t v, unsigned delta)
{
    (void)mask;
    uint64_t lo = emu_shfl_down32((uint32_t)v, delta);
    uint64_t hi = emu_shfl_down32((uint32_t)(v >> 32), delta);
    return lo | hi << 32;
}
