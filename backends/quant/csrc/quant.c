/* Fused block quantize / fake-quantize on the CPU: one pass over the input per call (two for the
 * tensor-scaled formats, NVFP4 and per-tensor FP8: the tensor amax first, in the same parallel
 * region).
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
#include <float.h>

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
    /* NVFP4 / per-tensor: computed here from the tensor amax (tensor_scales), written back to
     * global_out[0..2] = encode scale, its fp32 reciprocal, amax (NaN if the tensor is not finite) */
    float global_enc, global_dec, global_amax;
    int32_t tensor_nonfinite;
    float *global_out;
    float prescale;
    int32_t sr;
    uint32_t key;
    int32_t nthreads;
    int32_t had_g;            /* > 0: fused Hadamard of this size before quantizing (inner == 1) */
    float had_norm;           /* fp32(1/sqrt(had_g)) */
    const float *had_signs;   /* had_g entries of +-1, or NULL */
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

static inline void load_row(const void *p, int dt, int64_t i0, int64_t n, float *dst) {
    if (dt == DT_F32) {
        const float *s = (const float *)p + i0;
        for (int64_t i = 0; i < n; i++) dst[i] = s[i];
    } else if (dt == DT_BF16) {
        const uint16_t *s = (const uint16_t *)p + i0;
        for (int64_t i = 0; i < n; i++) dst[i] = u2f(((uint32_t)s[i]) << 16);
    } else {
        const _Float16 *s = (const _Float16 *)p + i0;
        for (int64_t i = 0; i < n; i++) dst[i] = (float)s[i];
    }
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

static inline void store_row(void *p, int dt, int64_t i0, int64_t n, const float *src) {
    if (dt == DT_F32) {
        float *d = (float *)p + i0;
        for (int64_t i = 0; i < n; i++) d[i] = src[i];
    } else if (dt == DT_BF16) {
        uint16_t *d = (uint16_t *)p + i0;
        for (int64_t i = 0; i < n; i++) d[i] = f32_to_bf16(src[i]);
    } else {
        _Float16 *d = (_Float16 *)p + i0;
        for (int64_t i = 0; i < n; i++) d[i] = (_Float16)src[i];
    }
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
        float fl = (float)(int32_t)t;           /* floor: t >= 0 and small (sr_cap) */
        q = fl + ((u < t - fl) ? 1.0f : 0.0f);
    } else {
        q = (t + 8388608.0f) - 8388608.0f;     /* round half to even (t < 2^22) */
    }
    q = q * exp2i(k);
    if (q > maxval) q = maxval;
    if (!(a == a)) q = a;                        /* NaN stays NaN */
    return u2f(f2u(q) | sign);
}

/* A scaled value for stochastic rounding with a huge multiplier (NVFP4's FLT_MAX for a block whose
 * E4M3 scale is 0): |v| capped at 2^24, where it saturates all the same, so round_elem's float to
 * int conversion stays defined. Only such blocks take it (a per-element min slows the loops 3-4x). */
#define SR_BIG_MUL 1e30f
static inline float sr_cap(float v) {
    return fabsf(v) < 16777216.0f ? v : copysignf(16777216.0f, v);
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
    if (amax_bits >= 0x7f800000u || p->tensor_nonfinite) {
        *code = (p->scale_kind == SC_NV) ? 0x7f : 0xff;
        return 0;
    }
    if (p->scale_kind == SC_E8M0) {
        int E = e8m0_exponent(amax_bits, p);
        *enc = exp2i(-E);
        *dec = exp2i(E);
        *code = (uint8_t)(E + 127);
    } else if (p->scale_kind == SC_NV) {
        /* TransformerEngine's NVFP4 arithmetic (quant.py's docstring), each step one fp32 operation:
         * block decode scale s8 = RNE_e4m3(min(amax_b * (S_enc * fp32(1/6)), 448)) */
        const float mult = p->global_enc * (1.0f / 6.0f);
        float s = u2f(amax_bits) * mult;
        if (s > 448.0f) s = 448.0f;
        float s8 = round_elem(s, 3, -6, 448.0f, 0, 0.0f);
        uint32_t sb = f2u(s8);
        int sex = (int)(sb >> 23) - 127;
        int mant = (int)((sb >> 20) & 7);
        *code = (s8 == 0.0f) ? 0 : (sex >= -6 ? (uint8_t)(((sex + 7) << 3) | mant)
                                               : (uint8_t)(s8 * 512.0f));
        /* element encode factor min(1 / (s8 * S_dec), FLT_MAX): FLT_MAX for s8 == 0 (1 / 0) */
        *enc = fminf(1.0f / (s8 * p->global_dec), FLT_MAX);
        /* decoded element = q * ((s8 * amax) * fp32(1/2688)), TE's dequantize_nvfp4 */
        *dec = (s8 * p->global_amax) * (1.0f / 2688.0f);
    } else {
        *enc = p->global_enc;
        *dec = p->global_dec;
        *code = 0;
    }
    return 1;
}

/* Uniform in [0, 1) on the 2^-24 grid for element index hi:lo (backends/quant/rng.py:
   uniform24): the index hashed first, then the key mixed in. */
static inline float u24(uint32_t key, uint32_t lo, uint32_t hi) {
    const uint32_t h = mix32(mix32(mix32(lo ^ 0x9e3779b9u) ^ hi) ^ key);
    return (float)(int32_t)(h >> 8) * 5.9604644775390625e-08f; /* 2^-24, exact */
}

static inline float sr_uniform(uint32_t key, int64_t idx) {
    return u24(key, (uint32_t)idx, (uint32_t)((uint64_t)idx >> 32));
}

#define MAXB 1024
#define PARALLEL_MIN 32768 /* elements: below this an OpenMP team costs more than it saves */
#define CHUNK 64

/* Hadamard of one contiguous group of g elements in place: signs, butterfly stages h = 1, 2, 4, ...
 * (a, b -> a + b, a - b), then the norm. The one definition used by both the fused quantizer and
 * ablate_hadamard; backends/hadamard.py runs the same operations in torch. */
static inline void fwht(float *v, int64_t g, const float *signs, float norm) {
    if (signs)
        for (int64_t i = 0; i < g; i++) v[i] *= signs[i];
    for (int64_t h = 1; h < g; h *= 2)
        for (int64_t b = 0; b < g; b += 2 * h)
            for (int64_t j = b; j < b + h; j++) {
                const float a = v[j], c = v[j + h];
                v[j] = a + c;
                v[j + h] = a - c;
            }
    for (int64_t i = 0; i < g; i++) v[i] *= norm;
}

/* Contiguous blocks (inner == 1). */
/* Quantize one block already in buf (float32): amax, scale, round, store. */
static inline void quant_block(const qparams *p, float *buf, int64_t n, int64_t base, int64_t sidx) {
    uint32_t amax = 0;
    if (p->scale_kind != SC_TENSOR) /* per tensor: no block amax (the tensor's is known) */
        for (int64_t i = 0; i < n; i++) {
            uint32_t ab = f2u(buf[i]) & 0x7fffffffu;
            amax = ab > amax ? ab : amax;
        }
    float enc = 0, dec = 0;
    uint8_t code;
    int ok = block_scale(amax, p, &enc, &dec, &code);
    if (p->scales) p->scales[sidx] = code;
    if (!ok) {
        const int dt = p->out_kind == OUT_ELEMENTS ? DT_F32 : p->out_dtype;
        for (int64_t i = 0; i < n; i++) store(p->out, dt, base + i, NAN);
        return;
    }
    const float mul = enc * p->prescale;
    if (!p->sr && p->prescale == 1.0f && p->out_kind == OUT_DEQUANT) {
        /* the hot path: round-to-nearest-even fake-quantize */
        for (int64_t i = 0; i < n; i++)
            buf[i] = round_elem(buf[i] * enc, p->mbits, p->emin, p->maxval, 0, 0.0f) * dec;
    } else {
        /* output = q * d1: dequantized, or in element units */
        const int elems = p->out_kind == OUT_ELEMENTS;
        const float d1 = elems ? 1.0f : dec;
        const int mbits = p->mbits, emin = p->emin;
        const float maxval = p->maxval;
        const uint32_t key = p->key;
        if (p->sr && mul >= SR_BIG_MUL) {
            for (int64_t i = 0; i < n; i++) {
                const float u = sr_uniform(key, base + i);
                buf[i] = round_elem(sr_cap(buf[i] * mul), mbits, emin, maxval, 1, u) * d1;
            }
        } else if (p->sr) {
            /* the block's indices share their high 32 bits unless it straddles 2^32 */
            const uint32_t hi = (uint32_t)((uint64_t)base >> 32);
            const uint32_t lo0 = (uint32_t)base;
            if ((uint32_t)((uint64_t)(base + n - 1) >> 32) == hi) {
                for (int64_t i = 0; i < n; i++) {
                    const float u = u24(key, lo0 + (uint32_t)i, hi);
                    buf[i] = round_elem(buf[i] * mul, mbits, emin, maxval, 1, u) * d1;
                }
            } else {
                for (int64_t i = 0; i < n; i++) {
                    const float u = sr_uniform(key, base + i);
                    buf[i] = round_elem(buf[i] * mul, mbits, emin, maxval, 1, u) * d1;
                }
            }
        } else {
            for (int64_t i = 0; i < n; i++)
                buf[i] = round_elem(buf[i] * mul, mbits, emin, maxval, 0, 0.0f) * d1;
        }
    }
    store_row(p->out, p->out_kind == OUT_ELEMENTS ? DT_F32 : p->out_dtype, base, n, buf);
}

/* Contiguous blocks (inner == 1), in work units of max(block, had_g) elements (with a fused
 * Hadamard the caller guarantees K is a multiple of the unit). */
static void run_inner1(const qparams *p) {
    const int64_t K = p->K, B = p->block, G = p->had_g;
    const int64_t L = G > B ? G : B;
    const int64_t nu = (K + L - 1) / L, nb = (K + B - 1) / B;
    const int64_t total = p->outer * nu;
#pragma omp for schedule(static) /* orphaned: inside ablate_quantize's parallel region */
    for (int64_t t = 0; t < total; t++) {
        const int64_t row = t / nu, k0 = (t % nu) * L;
        const int64_t n = (K - k0 < L) ? K - k0 : L;
        const int64_t base = row * K + k0;
        float buf[MAXB];
        load_row(p->x, p->in_dtype, base, n, buf);
        if (G)
            for (int64_t g0 = 0; g0 < n; g0 += G) fwht(buf + g0, G, p->had_signs, p->had_norm);
        for (int64_t b0 = 0; b0 < n; b0 += B)
            quant_block(p, buf + b0, (n - b0 < B) ? n - b0 : B, base + b0, row * nb + (k0 + b0) / B);
    }
}

/* Strided blocks (inner > 1): a block is `block` consecutive rows of one column. Columns are handled
 * CHUNK at a time so the per-column amax and scales stay in L1; rows are loaded contiguously. */
static void run_strided(const qparams *p) {
    const int64_t K = p->K, B = p->block, I = p->inner;
    const int64_t nb = (K + B - 1) / B;
    const int64_t nc = (I + CHUNK - 1) / CHUNK;
    const int64_t total = p->outer * nb * nc;
    const int out_dt = p->out_kind == OUT_ELEMENTS ? DT_F32 : p->out_dtype;
#pragma omp for schedule(static) /* orphaned: inside ablate_quantize's parallel region */
    for (int64_t t = 0; t < total; t++) {
        const int64_t o = t / (nb * nc), kb = (t / nc) % nb, c = t % nc;
        const int64_t k0 = kb * B, n = (K - k0 < B) ? K - k0 : B;
        const int64_t j0 = c * CHUNK, m = (I - j0 < CHUNK) ? I - j0 : CHUNK;
        const int64_t base = (o * K + k0) * I + j0;
        uint32_t amax[CHUNK];
        float enc[CHUNK], dec[CHUNK], row[CHUNK];
        for (int64_t j = 0; j < m; j++) amax[j] = 0;
        for (int64_t i = 0; i < n && p->scale_kind != SC_TENSOR; i++) { /* per tensor: no block amax */
            load_row(p->x, p->in_dtype, base + i * I, m, row);
            for (int64_t j = 0; j < m; j++) {
                uint32_t ab = f2u(row[j]) & 0x7fffffffu;
                amax[j] = ab > amax[j] ? ab : amax[j];
            }
        }
        for (int64_t j = 0; j < m; j++) {
            uint8_t code;
            if (block_scale(amax[j], p, &enc[j], &dec[j], &code)) {
                enc[j] *= p->prescale;
            } else { /* non-finite block: NaN propagates through the rounding to every element */
                enc[j] = NAN;
                dec[j] = NAN;
            }
            if (p->scales) p->scales[(o * nb + kb) * I + j0 + j] = code;
        }
        /* output = q * dec, as in run_inner1 */
        const int elems = p->out_kind == OUT_ELEMENTS;
        const int mbits = p->mbits, emin = p->emin;
        const float maxval = p->maxval;
        const uint32_t key = p->key;
        if (elems)
            for (int64_t j = 0; j < m; j++) dec[j] = dec[j] == dec[j] ? 1.0f : dec[j];
        int big = 0; /* a column whose multiplier is huge (see sr_cap) */
        for (int64_t j = 0; j < m; j++) big |= enc[j] >= SR_BIG_MUL;
        for (int64_t i = 0; i < n; i++) {
            load_row(p->x, p->in_dtype, base + i * I, m, row);
            if (p->sr) {
                /* random stream index: position in the axis-last (outer, inner, K) order */
                const int64_t idx0 = (o * I + j0) * K + k0 + i;
                if (big)
                    for (int64_t j = 0; j < m; j++) {
                        const float u = sr_uniform(key, idx0 + j * K);
                        const float v = sr_cap(row[j] * enc[j]);
                        row[j] = round_elem(v, mbits, emin, maxval, 1, u) * dec[j];
                    }
                else
                    for (int64_t j = 0; j < m; j++) {
                        const float u = sr_uniform(key, idx0 + j * K);
                        row[j] = round_elem(row[j] * enc[j], mbits, emin, maxval, 1, u) * dec[j];
                    }
            } else {
                for (int64_t j = 0; j < m; j++)
                    row[j] = round_elem(row[j] * enc[j], mbits, emin, maxval, 0, 0.0f) * dec[j];
            }
            store_row(p->out, out_dt, base + i * I, m, row);
        }
    }
}

/* The largest |x| of elements [i0, i0 + n) as float32 bits (NaN above +inf): the maximum of the
 * magnitude bits in the input's own format (monotone in |x| for IEEE formats, NaN above inf), one
 * vectorizable streaming pass. */
static uint32_t amax_bits_of(const qparams *p, int64_t i0, int64_t n) {
    if (p->in_dtype == DT_F32) {
        const uint32_t *s = (const uint32_t *)p->x + i0;
        uint32_t m = 0;
        for (int64_t i = 0; i < n; i++) {
            const uint32_t a = s[i] & 0x7fffffffu;
            m = a > m ? a : m;
        }
        return m;
    }
    const uint16_t *s = (const uint16_t *)p->x + i0;
    uint16_t m = 0;
    for (int64_t i = 0; i < n; i++) {
        const uint16_t a = s[i] & 0x7fffu;
        m = a > m ? a : m;
    }
    if (p->in_dtype == DT_BF16) return (uint32_t)m << 16;
    _Float16 h;
    memcpy(&h, &m, 2);
    return f2u((float)h) & 0x7fffffffu; /* exact; a NaN stays NaN */
}

/* The tensor scales of NVFP4 / per-tensor FP8 from the tensor amax, as quant._global_scales: encode
 * top / amax (top = max, NVFP4 448 * 6) saturated at FLT_MAX, 1 for amax 0 or a non-finite tensor;
 * decode its fp32 reciprocal. */
static void tensor_scales(qparams *p, uint32_t amax_bits) {
    if (amax_bits >= 0x7f800000u) {
        p->tensor_nonfinite = 1;
        p->global_enc = p->global_dec = 1.0f;
        p->global_amax = NAN;
        return;
    }
    const float amax = u2f(amax_bits);
    const float top = p->maxval * (p->scale_kind == SC_NV ? 448.0f : 1.0f);
    p->global_enc = amax == 0.0f ? 1.0f : fminf(top / amax, FLT_MAX);
    p->global_dec = 1.0f / p->global_enc;
    p->global_amax = amax;
}

#define AMAX_CHUNK 16384

int ablate_quantize(const qparams *p_in) {
    if (p_in->block <= 0 || p_in->block > MAXB) return 1;
    if (p_in->had_g && (p_in->inner != 1 || p_in->had_g > 256 || p_in->K % (p_in->had_g > p_in->block ? p_in->had_g : p_in->block))) return 2;
    qparams p = *p_in; /* shared by the team; the tensor scales are filled in below */
    p.tensor_nonfinite = 0;
    const int64_t total = p.outer * p.K * p.inner;
    const int global = p.scale_kind != SC_E8M0;
    const int nt = total >= PARALLEL_MIN && p.nthreads > 1 ? p.nthreads : 1;
    uint32_t amax = 0;
    /* one parallel region per call: the tensor amax (per-tensor formats, NVFP4), a barrier, then
     * the quantization (an OpenMP team costs a wake-up per region, a scheduler tick when a core is
     * busy elsewhere) */
#pragma omp parallel num_threads(nt)
    {
        if (global) {
            uint32_t local = 0;
            const int64_t nch = (total + AMAX_CHUNK - 1) / AMAX_CHUNK;
#pragma omp for schedule(static) nowait
            for (int64_t c = 0; c < nch; c++) {
                const int64_t i0 = c * AMAX_CHUNK;
                const uint32_t m = amax_bits_of(&p, i0, (total - i0 < AMAX_CHUNK) ? total - i0 : AMAX_CHUNK);
                local = m > local ? m : local;
            }
#pragma omp critical(ablate_amax)
            amax = local > amax ? local : amax;
#pragma omp barrier
#pragma omp single
            tensor_scales(&p, amax); /* implicit barrier after it */
        }
        if (p.inner == 1) run_inner1(&p);
        else run_strided(&p);
    }
    if (global && p.global_out) {
        p.global_out[0] = p.global_enc;
        p.global_out[1] = p.global_dec;
        p.global_out[2] = p.global_amax;
    }
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

/* ---------------------------------------------------------------------------------------------
 * Block-diagonal Hadamard transform along K (K a multiple of g): y = (x * signs) @ H_g * norm, as
 * the in-place fast Walsh-Hadamard butterfly (stages h = 1, 2, 4, ...: a, b -> a + b, a - b) in
 * float32, then one multiplication by norm = fp32(1/sqrt(g)). backends/hadamard.py runs the same
 * butterfly in torch, so both give identical bits. Output is float32 in the input's layout. */
typedef struct {
    int64_t outer, K, inner;
    int32_t g, in_dtype, nthreads;
    float norm;
    const float *signs; /* g entries of +-1, or NULL */
    const void *x;
    float *out;
} hparams;

int ablate_hadamard(const hparams *p) {
    const int64_t K = p->K, I = p->inner, g = p->g;
    if (g <= 0 || g > 256 || (g & (g - 1)) || K % g) return 1;
    const int64_t ng = K / g;
    if (I == 1) {
        const int64_t total = p->outer * ng;
#pragma omp parallel for schedule(static) num_threads(p->nthreads) if (p->K * p->outer * p->inner >= PARALLEL_MIN)
        for (int64_t t = 0; t < total; t++) {
            float v[256];
            load_row(p->x, p->in_dtype, t * g, g, v);
            fwht(v, g, p->signs, p->norm);
            float *o = p->out + t * g;
            for (int64_t i = 0; i < g; i++) o[i] = v[i];
        }
        return 0;
    }
    /* strided: a group is g rows of CHUNK columns; the butterflies combine whole rows */
    const int64_t nc = (I + CHUNK - 1) / CHUNK;
    const int64_t total = p->outer * ng * nc;
#pragma omp parallel for schedule(static) num_threads(p->nthreads) if (p->K * p->outer * p->inner >= PARALLEL_MIN)
    for (int64_t t = 0; t < total; t++) {
        const int64_t o = t / (ng * nc), kg = (t / nc) % ng, c = t % nc;
        const int64_t j0 = c * CHUNK, m = (I - j0 < CHUNK) ? I - j0 : CHUNK;
        const int64_t base = (o * K + kg * g) * I + j0;
        float v[256][CHUNK];
        for (int64_t i = 0; i < g; i++) {
            load_row(p->x, p->in_dtype, base + i * I, m, v[i]);
            if (p->signs)
                for (int64_t j = 0; j < m; j++) v[i][j] *= p->signs[i];
        }
        for (int64_t h = 1; h < g; h *= 2)
            for (int64_t b = 0; b < g; b += 2 * h)
                for (int64_t r = b; r < b + h; r++)
                    for (int64_t j = 0; j < m; j++) {
                        const float a = v[r][j], d = v[r + h][j];
                        v[r][j] = a + d;
                        v[r + h][j] = a - d;
                    }
        for (int64_t i = 0; i < g; i++) {
            float *orow = p->out + base + i * I;
            for (int64_t j = 0; j < m; j++) orow[j] = v[i][j] * p->norm;
        }
    }
    return 0;
}
