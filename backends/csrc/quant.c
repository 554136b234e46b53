/* Fused block quantize / fake-quantize on the CPU: one pass over the input per call.
 *
 * The tensor is viewed as (outer, K, inner) and quantized along K in blocks of `block` elements
 * (the last block may be short: the zero padding of the reduction dimension changes no amax and
 * produces no output). inner == 1 is the contiguous case; inner > 1 quantizes along a strided axis
 * (e.g. the token dimension of a row-major activation for the Wgrad GEMM) without a transpose.
 *
 * Every rule here is mirrored by the pure-torch reference in backends/quant.py and the two are tested
 * bit for bit against each other (and against torchao). No -ffast-math: the rounding relies on IEEE
 * float32 semantics (exact power-of-two scaling, round-to-nearest-even of `(t + 2^23) - 2^23`).
 */
#include <stdint.h>
#include <string.h>
#include <math.h>

enum { DT_F32 = 0, DT_BF16 = 1, DT_F16 = 2 };
enum { SC_E8M0 = 0, SC_NV = 1, SC_TENSOR = 2 };
enum { M_FLOOR = 0, M_CEIL = 1, M_EVEN = 2, M_RCEIL = 3 };
enum { OUT_DEQUANT = 0, OUT_ELEMENTS = 1 };

typedef struct {
    int64_t outer, K, inner;
    int32_t block;
    int32_t in_dtype, out_dtype, out_kind;
    int32_t mbits, emin, emax;
    float maxval;
    int32_t scale_kind, scale_mode;
    float global_enc, global_dec; /* NVFP4 / per-tensor: encode scale and its fp32 reciprocal */
    float prescale;
    int32_t sr;
    uint32_t key;
    int32_t nthreads;
    const void *x;
    void *out;
    uint8_t *scales;
} qparams;

static inline uint32_t f2u(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static inline float u2f(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

static inline uint32_t mix32(uint32_t x) {
    x ^= x >> 16; x *= 0x21f0aaadu; x ^= x >> 15; x *= 0x735a2d97u; x ^= x >> 15;
    return x;
}

static inline float load(const void *p, int dt, int64_t i) {
    if (dt == DT_F32) return ((const float *)p)[i];
    if (dt == DT_BF16) return u2f(((uint32_t)((const uint16_t *)p)[i]) << 16);
    return (float)((const _Float16 *)p)[i];
}

static inline uint16_t f32_to_bf16(float f) { /* round to nearest even, as torch does */
    uint32_t u = f2u(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

static inline void store(void *p, int dt, int64_t i, float v) {
    if (dt == DT_F32) ((float *)p)[i] = v;
    else if (dt == DT_BF16) ((uint16_t *)p)[i] = f32_to_bf16(v);
    else ((_Float16 *)p)[i] = (_Float16)v;
}

/* 2^e as float for e in [-149, 127]. */
static inline float exp2i(int e) {
    if (e >= -126) return u2f((uint32_t)(e + 127) << 23);
    return u2f(1u << (e + 149));
}

/* Round a scaled value v to the element grid (mbits fraction bits, smallest exponent emin), saturate
 * to +-maxval, keep the sign (also of zero). sr: round up iff u < fractional part, u in [0,1). */
static inline float round_elem(float v, int mbits, int emin, float maxval, int sr, float u) {
    uint32_t bits = f2u(v);
    uint32_t sign = bits & 0x80000000u;
    float a = u2f(bits ^ sign);
    int e = (int)((bits >> 23) & 0xff) - 127;
    int k = (e > emin ? e : emin) - mbits;     /* grid spacing in this binade is 2^k */
    float t = a * exp2i(-k);                    /* exact: t < 2^(mbits+2) */
    float q;
    if (sr) {
        float fl = floorf(t);
        q = fl + ((u < t - fl) ? 1.0f : 0.0f);
    } else {
        q = (t + 8388608.0f) - 8388608.0f;     /* round half to even (t < 2^22) */
    }
    q = q * exp2i(k);
    if (q > maxval) q = maxval;
    if (!(a == a)) q = a;                        /* NaN stays NaN */
    return u2f(f2u(q) | sign);
}

/* The E8M0 scale exponent of a block from its amax bit pattern (finite). */
static inline int e8m0_exponent(uint32_t ab, const qparams *p) {
    int ex = (int)(ab >> 23);                   /* biased exponent of amax (0 for zero/subnormal) */
    int E;
    switch (p->scale_mode) {
    case M_FLOOR: E = ex - 127 - p->emax; break;
    case M_CEIL: E = ex - 127 + ((ab & 0x7fffffu) != 0) - p->emax; break;
    case M_EVEN: E = (int)((ab + (1u << (22 - p->mbits))) >> 23) - 127 - p->emax; break;
    default: { /* RCEIL: ceil(log2(fp32(amax / max))) */
        uint32_t db = f2u(u2f(ab) / p->maxval);
        int dex = (int)(db >> 23);
        uint32_t dm = db & 0x7fffffu;
        if (dex == 0) E = (dm > 0x400000u) ? -126 : -127; /* subnormal descale */
        else E = dex - 127 + (dm != 0);
    }
    }
    if (E < -127) E = -127;
    if (E > 127) E = 127;
    return E;
}

/* Per-block scale: returns 0 when the block is non-finite (then the whole block is NaN). */
static inline int block_scale(uint32_t amax_bits, const qparams *p, float *enc, float *dec,
                              uint8_t *code) {
    if (amax_bits >= 0x7f800000u) {
        *code = (p->scale_kind == SC_NV) ? 0x7f : 0xff;
        return 0;
    }
    if (p->scale_kind == SC_E8M0) {
        int E = e8m0_exponent(amax_bits, p);
        *enc = exp2i(-E);
        *dec = exp2i(E);
        *code = (uint8_t)(E + 127);
    } else if (p->scale_kind == SC_NV) {
        /* E4M3 block decode scale = RNE_e4m3((amax / 6) * S_enc), saturating at 448 */
        float s = (u2f(amax_bits) / p->maxval) * p->global_enc;
        float s8 = round_elem(s, 3, -6, 448.0f, 0, 0.0f);
        uint32_t sb = f2u(s8);
        int sex = (int)(sb >> 23) - 127;
        int mant = (int)((sb >> 20) & 7);
        *code = (s8 == 0.0f) ? 0 : (sex >= -6 ? (uint8_t)(((sex + 7) << 3) | mant)
                                               : (uint8_t)(s8 * 512.0f));
        *enc = (s8 == 0.0f) ? 0.0f : p->global_enc / s8;
        *dec = s8; /* dequantized element = (q * s8) * global_dec, see quant.py */
    } else {
        *enc = p->global_enc;
        *dec = p->global_dec;
        *code = 0;
    }
    return 1;
}

static inline float sr_uniform(uint32_t key, int64_t idx) {
    uint32_t h = mix32(mix32((uint32_t)idx ^ key) ^ (uint32_t)((uint64_t)idx >> 32));
    return (float)(h >> 8) * 5.9604644775390625e-08f; /* 2^-24 */
}

static inline float finish(float q, const qparams *p, float dec) {
    if (p->out_kind == OUT_ELEMENTS) return q;
    if (p->scale_kind == SC_NV) return (q * dec) * p->global_dec;
    return q * dec;
}

#define MAXB 1024
#define CHUNK 64

/* Contiguous blocks (inner == 1). */
static void run_inner1(const qparams *p) {
    const int64_t K = p->K, B = p->block;
    const int64_t nb = (K + B - 1) / B;
    const int64_t total = p->outer * nb;
#pragma omp parallel for schedule(static) num_threads(p->nthreads)
    for (int64_t t = 0; t < total; t++) {
        const int64_t row = t / nb, kb = t % nb;
        const int64_t k0 = kb * B;
        const int64_t n = (K - k0 < B) ? K - k0 : B;
        const int64_t base = row * K + k0;
        float buf[MAXB];
        uint32_t amax = 0;
        for (int64_t i = 0; i < n; i++) {
            float v = load(p->x, p->in_dtype, base + i);
            buf[i] = v;
            uint32_t ab = f2u(v) & 0x7fffffffu;
            amax = ab > amax ? ab : amax;
        }
        float enc = 0, dec = 0;
        uint8_t code;
        int ok = block_scale(amax, p, &enc, &dec, &code);
        if (p->scales) p->scales[t] = code;
        if (!ok) {
            const int dt = p->out_kind == OUT_ELEMENTS ? DT_F32 : p->out_dtype;
            for (int64_t i = 0; i < n; i++) store(p->out, dt, base + i, NAN);
            continue;
        }
        const float mul = enc * p->prescale;
        if (p->out_kind == OUT_ELEMENTS) {
            float *o = (float *)p->out;
            for (int64_t i = 0; i < n; i++) {
                float u = p->sr ? sr_uniform(p->key, base + i) : 0.0f;
                o[base + i] = round_elem(buf[i] * mul, p->mbits, p->emin, p->maxval, p->sr, u);
            }
        } else if (!p->sr && p->scale_kind == SC_E8M0 && p->prescale == 1.0f) {
            /* the hot path: MX round-to-nearest-even fake-quantize */
            for (int64_t i = 0; i < n; i++)
                buf[i] = round_elem(buf[i] * enc, p->mbits, p->emin, p->maxval, 0, 0.0f) * dec;
            for (int64_t i = 0; i < n; i++) store(p->out, p->out_dtype, base + i, buf[i]);
        } else {
            for (int64_t i = 0; i < n; i++) {
                float u = p->sr ? sr_uniform(p->key, base + i) : 0.0f;
                float q = round_elem(buf[i] * mul, p->mbits, p->emin, p->maxval, p->sr, u);
                buf[i] = finish(q, p, dec);
            }
            for (int64_t i = 0; i < n; i++) store(p->out, p->out_dtype, base + i, buf[i]);
        }
    }
}

/* Strided blocks (inner > 1): a block is `block` consecutive rows of one column. Columns are handled
 * CHUNK at a time so the per-column amax and scales stay in registers/L1. */
static void run_strided(const qparams *p) {
    const int64_t K = p->K, B = p->block, I = p->inner;
    const int64_t nb = (K + B - 1) / B;
    const int64_t nc = (I + CHUNK - 1) / CHUNK;
    const int64_t total = p->outer * nb * nc;
    const int out_dt = p->out_kind == OUT_ELEMENTS ? DT_F32 : p->out_dtype;
#pragma omp parallel for schedule(static) num_threads(p->nthreads)
    for (int64_t t = 0; t < total; t++) {
        const int64_t o = t / (nb * nc), kb = (t / nc) % nb, c = t % nc;
        const int64_t k0 = kb * B, n = (K - k0 < B) ? K - k0 : B;
        const int64_t j0 = c * CHUNK, m = (I - j0 < CHUNK) ? I - j0 : CHUNK;
        const int64_t base = (o * K + k0) * I + j0;
        uint32_t amax[CHUNK];
        float enc[CHUNK], dec[CHUNK];
        int ok[CHUNK];
        for (int64_t j = 0; j < m; j++) amax[j] = 0;
        for (int64_t i = 0; i < n; i++)
            for (int64_t j = 0; j < m; j++) {
                uint32_t ab = f2u(load(p->x, p->in_dtype, base + i * I + j)) & 0x7fffffffu;
                amax[j] = ab > amax[j] ? ab : amax[j];
            }
        for (int64_t j = 0; j < m; j++) {
            uint8_t code;
            ok[j] = block_scale(amax[j], p, &enc[j], &dec[j], &code);
            enc[j] *= p->prescale;
            if (p->scales) p->scales[(o * nb + kb) * I + j0 + j] = code;
        }
        for (int64_t i = 0; i < n; i++)
            for (int64_t j = 0; j < m; j++) {
                const int64_t idx = base + i * I + j;
                float r;
                if (!ok[j]) {
                    r = NAN;
                } else {
                    /* random stream index: position in the axis-last (outer, inner, K) order */
                    float u = p->sr ? sr_uniform(p->key, (o * I + j0 + j) * K + k0 + i) : 0.0f;
                    float v = load(p->x, p->in_dtype, idx) * enc[j];
                    r = finish(round_elem(v, p->mbits, p->emin, p->maxval, p->sr, u), p, dec[j]);
                }
                store(p->out, out_dt, idx, r);
            }
    }
}

int ablate_quantize(const qparams *p) {
    if (p->block <= 0 || p->block > MAXB) return 1;
    if (p->inner == 1) run_inner1(p);
    else run_strided(p);
    return 0;
}

int ablate_num_threads(void) {
#ifdef _OPENMP
    extern int omp_get_max_threads(void);
    return omp_get_max_threads();
#else
    return 1;
#endif
}
