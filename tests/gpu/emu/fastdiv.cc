/* The proof behind qf_div (plugins/fp8/quant_fp8.cu), run on the CPU through
 * the kernel's own code (the emulated source, run.sh): for each 16-bit
 * dtype (F16, BF16), every finite amax a and every x of that dtype with
 * |x| <= a (both signs; x of one group never exceeds its amax), with
 * s = qf_scale(a) and r = qf_recip(s), the E4M3 byte of qf_div(x, s, r)
 * equals the byte of the full division x / s (correctly rounded here as
 * __fdiv_rn is on the device), and the quotient is finite (so the
 * hardware conversion, equal to the integer encoder on finite inputs,
 * agrees too). The quotients themselves differ only where x and s are so
 * small that the FMA residual leaves the normal range, and all below E4M3's
 * rounding to 0 (the largest differing one is printed). About 2^31 pairs a dtype; a few seconds. */
#include "quant_fp8_emu.cc"

static int prove(int kind)
{
    const uint32_t top = kind == 2 ? 0x7f7fu : 0x7bffu; /* largest finite magnitude */
    unsigned long long pairs = 0, quot = 0, fast = 0;
    float worst = 0.0f; /* the largest full quotient where the two differ */
    for (uint32_t a = 0; a <= top; a++) {
        uint32_t abits = kind == 2 ? a << 16 : refit_mf_bits_f16_to_f32((uint16_t)a);
        float s = qf_scale(abits), r = qf_recip(s, kind, true);
        fast += r != 0.0f;
        for (uint32_t xm = 0; xm <= a; xm++)
            for (uint32_t sign = 0; sign < 2; sign++) {
                uint32_t h = xm | sign << 15;
                float x = __uint_as_float(kind == 2 ? h << 16 : refit_mf_bits_f16_to_f32((uint16_t)h));
                float want = __fdiv_rn(x, s), got = qf_div(x, s, r);
                pairs++;
                bool differ = __float_as_uint(want) != __float_as_uint(got);
                quot += differ;
                if (differ && (want < 0 ? -want : want) > worst)
                    worst = want < 0 ? -want : want;
                if (!((got < 0 ? -got : got) <= 3.4e38f) ||
                    refit_mf_f32_to_e4m3_sat(got) != refit_mf_f32_to_e4m3_sat(want)) {
                    fprintf(stderr, "fastdiv: %s x %a / s %a: %a (byte %02x), full %a (%02x)\n",
                            kind == 2 ? "bf16" : "f16", x, s, got,
                            refit_mf_f32_to_e4m3_sat(got), want,
                            refit_mf_f32_to_e4m3_sat(want));
                    return 1;
                }
            }
    }
    printf("fastdiv: %s: %llu pairs, every byte equal (%llu quotients differ, all of "
           "magnitude <= %a); %llu of %u scales take the reciprocal\n",
           kind == 2 ? "bf16" : "f16", pairs, quot, (double)worst, fast, top + 1);
    return fast == 0; /* the shortcut is taken */
}

int main(void)
{
    return prove(1) || prove(2);
}
