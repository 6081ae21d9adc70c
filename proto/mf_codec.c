/* mf_codec — scalar formats of map rows; see mf_codec.h for the error bounds. */
#include "mf_codec.h"

#include <math.h>
#include <string.h>

static uint32_t f2u(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static float u2f(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

uint16_t mf_f32_to_f16(float f)
{
    const uint32_t f32inf = 255u << 23;
    const uint32_t f16max = (127u + 16u) << 23;           /* 2^16: rounds to inf */
    const uint32_t denorm_magic = ((127u - 15u) + (23u - 10u) + 1u) << 23;
    uint32_t u = f2u(f);
    uint32_t sign = u & 0x80000000u;
    uint16_t o;

    u ^= sign;
    if (u >= f16max) {
        o = u > f32inf ? 0x7e00 : 0x7c00;
    } else if (u < (113u << 23)) {
        /* Subnormal half: let the FPU round by adding a magic number. */
        o = (uint16_t)(f2u(u2f(u) + u2f(denorm_magic)) - denorm_magic);
    } else {
        uint32_t mant_odd = (u >> 13) & 1u;
        u += ((uint32_t)(15 - 127) << 23) + 0xfffu;
        u += mant_odd;
        o = (uint16_t)(u >> 13);
    }
    return (uint16_t)(o | (sign >> 16));
}

float mf_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t mant = h & 0x3ffu;
    if (exp == 0) {
        float v = ldexpf((float)mant, -24);
        return sign ? -v : v;
    }
    if (exp == 31)
        return u2f(sign | 0x7f800000u | (mant << 13));
    return u2f(sign | ((exp + 112u) << 23) | (mant << 13));
}

uint16_t mf_f32_to_bf16(float f)
{
    uint32_t u = f2u(f);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((u >> 16) | 0x40u); /* quiet NaN */
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

float mf_bf16_to_f32(uint16_t h)
{
    return u2f((uint32_t)h << 16);
}

float mf_e4m3_to_f32(uint8_t c)
{
    uint32_t e = (c >> 3) & 0xfu, m = c & 7u;
    float v;
    if ((c & 0x7fu) == 0x7fu)
        return NAN;
    if (e == 0)
        v = ldexpf((float)m, -9);
    else
        v = ldexpf(1.0f + (float)m / 8.0f, (int)e - 7);
    return (c & 0x80u) ? -v : v;
}

uint8_t mf_f32_to_e4m3(float f)
{
    if (isnan(f))
        return 0x7f;
    uint8_t sign = signbit(f) ? 0x80 : 0;
    float a = fabsf(f);
    if (a >= 448.0f)
        return sign | 0x7e;
    /* Codes 0..0x7e are monotonic in value: binary search for the neighbours, then
     * round to nearest with ties to the even code. */
    int lo = 0, hi = 0x7e;
    while (hi - lo > 1) {
        int mid = (lo + hi) / 2;
        if (mf_e4m3_to_f32((uint8_t)mid) <= a)
            lo = mid;
        else
            hi = mid;
    }
    float vl = mf_e4m3_to_f32((uint8_t)lo), vh = mf_e4m3_to_f32((uint8_t)hi);
    int c;
    if (a - vl < vh - a)
        c = lo;
    else if (a - vl > vh - a)
        c = hi;
    else
        c = (lo & 1) ? hi : lo;
    return (uint8_t)(sign | c);
}

uint8_t mf_fp8_encode(float p, float m)
{
    if (!(m > 0.0f) || !(p > 0.0f))
        return 0;
    return mf_f32_to_e4m3(p * (448.0f / m));
}

float mf_fp8_decode(uint8_t c, float m)
{
    if (!(m > 0.0f))
        return 0.0f;
    return mf_e4m3_to_f32(c) * (m / 448.0f);
}

uint8_t mf_u8log_encode(float p, float m)
{
    if (!(m > 0.0f) || !(p > 0.0f))
        return 0;
    /* Below half of the smallest nonzero code, zero is the nearer value. */
    if (p < 0.5f * mf_u8log_decode(1, m))
        return 0;
    double t = 255.0 + 16.0 * log2((double)p / (double)m);
    long q = lround(t);
    if (q < 1)
        q = 1;
    if (q > 255)
        q = 255;
    return (uint8_t)q;
}

float mf_u8log_decode(uint8_t q, float m)
{
    if (q == 0 || !(m > 0.0f))
        return 0.0f;
    return m * exp2f(((float)q - 255.0f) / 16.0f);
}

uint8_t mf_mass_encode(float mass)
{
    if (!(mass > 0.0f))
        return 0;
    if (mass >= 1.0f)
        return 255;
    return (uint8_t)lrintf(sqrtf(mass) * 255.0f);
}

float mf_mass_decode(uint8_t q)
{
    float s = (float)q / 255.0f;
    return s * s;
}
