// promptlookup: a block of weight rows against a block of activation columns (a batch's tokens).
// For every (row, column) pair the operations are those of the one-column kernel above
// (ggml_vec_dot_q4_0_q8_0, _q4_1_q8_1, _q5_0_q8_0, _q5_1_q8_1, _q8_0_q8_0, and _q2_K_q8_K to
// _q6_K_q8_K; F16 in vec.cpp's ggml_vec_dot_f16_cols beside ggml_vec_dot_f16), with the same helpers in
// the same order, so each result equals the one-column kernel's bit for bit whatever else is in the
// batch. What the columns share is done once: a row's quants are unpacked and its scales converted
// once per block for all the columns. The float operations of each pair (its scale products, its
// fused multiply-adds into eight lanes, the final horizontal sum) are upstream's exactly; the
// K-quants' integer sums are exact, so only which products each of the eight int32 lanes adds up
// must be upstream's (it is: the same maddubs/madd lanes), not the order it adds them in.
#if defined(__AVX2__)
#if defined(__AVX512VL__)
#define PL_COLS_STEP 8      // columns per pass over the rows: 32 vector registers hold their sums
#else
#define PL_COLS_STEP 4
#endif
#define PL_COLS_MAX_NB 128  // blocks of a row (4096 values) a packed tile holds: 40 KB of stack
#define PL_COLS_MAX_NBK 64  // super-blocks of a K-quant row (16384 values): 8 KB of column sums

typedef struct {
    int8_t q[PL_COLS_STEP][32];  // each column's quants of this block
    float d[PL_COLS_STEP];       // its scale
    float s[PL_COLS_STEP];       // its scaled sum (Q8_1 only)
} pl_cols_block;

// Q4_1 and Q5_1 rows against Q8_1 columns: upstream's two kernels differ only in how a block's 32
// unsigned quants are made (Q5_1: four low bits, the fifth from qh); their float steps are the same
// (Q5_1 writes the scale product's fused multiply-add with its factors the other way round: the same
// exact product, so the same rounding)
static inline __attribute__((always_inline)) __m256i pl_q4_1_quants(const block_q4_1 * GGML_RESTRICT x) {
    return bytes_from_nibbles_32(x->qs);
}

static inline __attribute__((always_inline)) __m256i pl_q5_1_quants(const block_q5_1 * GGML_RESTRICT x) {
    __m256i qx = bytes_from_nibbles_32(x->qs);
    __m256i bxhi = bytes_from_bits_32(x->qh);
    bxhi = _mm256_and_si256(bxhi, _mm256_set1_epi8(0x10));
    return _mm256_or_si256(qx, bxhi);
}

#define PL_Q8_1_COLS_BODY(QUANTS)                                                      \
    __m256 acc[PL_COLS_STEP];                                                          \
    float summs[PL_COLS_STEP];                                                         \
    for (int c = 0; c < nc; ++c) {                                                     \
        acc[c] = _mm256_setzero_ps();                                                  \
        summs[c] = 0;                                                                  \
    }                                                                                  \
    for (int ib = 0; ib < nb; ++ib) {                                                  \
        const float d0 = GGML_CPU_FP16_TO_FP32(x[ib].d);                               \
        const float m0 = GGML_CPU_FP16_TO_FP32(x[ib].m);                               \
        const __m256 d0v = _mm256_set1_ps( d0 );                                       \
        const __m256i qx = QUANTS(&x[ib]);                                             \
        for (int c = 0; c < nc; ++c) {                                                 \
            summs[c] += m0 * t[ib].s[c];                                               \
            const __m256 d0d1 = _mm256_mul_ps( d0v, _mm256_set1_ps( t[ib].d[c] ) );   \
            const __m256i qy = _mm256_loadu_si256( (const __m256i *)t[ib].q[c] );      \
            const __m256 xy = mul_sum_us8_pairs_float(qx, qy);                         \
            acc[c] = _mm256_fmadd_ps( d0d1, xy, acc[c] );                              \
        }                                                                              \
    }                                                                                  \
    for (int c = 0; c < nc; ++c) {                                                     \
        *s[c] = hsum_float_8(acc[c]) + summs[c];                                       \
    }

static inline __attribute__((always_inline)) void pl_q4_1_cols(const int nb, float * const * GGML_RESTRICT s,
        const block_q4_1 * GGML_RESTRICT x, const pl_cols_block * GGML_RESTRICT t, const int nc) {
    PL_Q8_1_COLS_BODY(pl_q4_1_quants)
}

static inline __attribute__((always_inline)) void pl_q5_1_cols(const int nb, float * const * GGML_RESTRICT s,
        const block_q5_1 * GGML_RESTRICT x, const pl_cols_block * GGML_RESTRICT t, const int nc) {
    PL_Q8_1_COLS_BODY(pl_q5_1_quants)
}

// Q8_0, Q5_0 and Q4_0 rows against Q8_0 columns: upstream's three kernels differ only in how a
// block's 32 signed quants are made (Q5_0: four low bits, the fifth from qh, minus 16; Q4_0: four
// bits minus 8)
static inline __attribute__((always_inline)) __m256i pl_q8_0_quants(const block_q8_0 * GGML_RESTRICT x) {
    return _mm256_loadu_si256((const __m256i *)x->qs);
}

static inline __attribute__((always_inline)) __m256i pl_q4_0_quants(const block_q4_0 * GGML_RESTRICT x) {
    return _mm256_sub_epi8(bytes_from_nibbles_32(x->qs), _mm256_set1_epi8(8));
}

static inline __attribute__((always_inline)) __m256i pl_q5_0_quants(const block_q5_0 * GGML_RESTRICT x) {
    __m256i qx = bytes_from_nibbles_32(x->qs);
    __m256i bxhi = bytes_from_bits_32(x->qh);
    bxhi = _mm256_andnot_si256(bxhi, _mm256_set1_epi8((char)0xF0));
    return _mm256_or_si256(qx, bxhi);
}

#define PL_Q8_0_COLS_BODY(QUANTS)                                                      \
    __m256 acc[PL_COLS_STEP];                                                          \
    for (int c = 0; c < nc; ++c) {                                                     \
        acc[c] = _mm256_setzero_ps();                                                  \
    }                                                                                  \
    for (int ib = 0; ib < nb; ++ib) {                                                  \
        const float d0 = GGML_CPU_FP16_TO_FP32(x[ib].d);                               \
        const __m256i qx = QUANTS(&x[ib]);                                             \
        for (int c = 0; c < nc; ++c) {                                                 \
            const __m256 d = _mm256_set1_ps(d0 * t[ib].d[c]);                          \
            const __m256i qy = _mm256_loadu_si256((const __m256i *)t[ib].q[c]);        \
            const __m256 q = mul_sum_i8_pairs_float(qx, qy);                           \
            acc[c] = _mm256_fmadd_ps( d, q, acc[c] );                                  \
        }                                                                              \
    }                                                                                  \
    for (int c = 0; c < nc; ++c) {                                                     \
        *s[c] = hsum_float_8(acc[c]);                                                  \
    }

static inline __attribute__((always_inline)) void pl_q8_0_cols(const int nb, float * const * GGML_RESTRICT s,
        const block_q8_0 * GGML_RESTRICT x, const pl_cols_block * GGML_RESTRICT t, const int nc) {
    PL_Q8_0_COLS_BODY(pl_q8_0_quants)
}

static inline __attribute__((always_inline)) void pl_q5_0_cols(const int nb, float * const * GGML_RESTRICT s,
        const block_q5_0 * GGML_RESTRICT x, const pl_cols_block * GGML_RESTRICT t, const int nc) {
    PL_Q8_0_COLS_BODY(pl_q5_0_quants)
}

static inline __attribute__((always_inline)) void pl_q4_0_cols(const int nb, float * const * GGML_RESTRICT s,
        const block_q4_0 * GGML_RESTRICT x, const pl_cols_block * GGML_RESTRICT t, const int nc) {
    PL_Q8_0_COLS_BODY(pl_q4_0_quants)
}

// -- K-quants: Q8_K columns are read in place (each block's quants are contiguous); what a column's
// block contributes independently of the row (Q4_K, Q5_K: the pairwise sums of its bsums) is made once
typedef struct {
    const block_q8_K * y[PL_COLS_STEP];        // the columns
    __m128i q8s[PL_COLS_MAX_NBK][PL_COLS_STEP];  // Q4_K, Q5_K: _mm_hadd_epi16 of each block's bsums
} pl_cols_k;

// Q4_K and Q5_K: a super-block's eight 6-bit scales and eight 6-bit minimums, packed in 12 bytes,
// widened to 16 bits as upstream's kernels widen them (the scales twice, for both 128-bit lanes)
static inline __attribute__((always_inline)) void pl_k_scales_mins(const uint8_t * GGML_RESTRICT packed,
        __m128i * mins, __m256i * scales) {
    static const uint32_t kmask1 = 0x3f3f3f3f;
    static const uint32_t kmask2 = 0x0f0f0f0f;
    static const uint32_t kmask3 = 0x03030303;
    uint32_t utmp[4];
    memcpy(utmp, packed, 12);
    utmp[3] = ((utmp[2] >> 4) & kmask2) | (((utmp[1] >> 6) & kmask3) << 4);
    const uint32_t uaux = utmp[1] & kmask1;
    utmp[1] = (utmp[2] & kmask2) | (((utmp[0] >> 6) & kmask3) << 4);
    utmp[2] = uaux;
    utmp[0] &= kmask1;

    const __m256i mins_and_scales = _mm256_cvtepu8_epi16(_mm_set_epi32(utmp[3], utmp[2], utmp[1], utmp[0]));
    *mins = _mm256_extracti128_si256(mins_and_scales, 1);
    const __m128i sc128 = _mm256_extracti128_si256(mins_and_scales, 0);
    *scales = MM256_SET_M128I(sc128, sc128);
}

static inline __attribute__((always_inline)) void pl_q4_K_cols(const int nb, float * const * GGML_RESTRICT s,
        const block_q4_K * GGML_RESTRICT x, const pl_cols_k * GGML_RESTRICT t, const int nc) {
    const __m256i m4 = _mm256_set1_epi8(0xF);
    __m256 acc[PL_COLS_STEP];
    __m128 acc_m[PL_COLS_STEP];
    for (int c = 0; c < nc; ++c) {
        acc[c] = _mm256_setzero_ps();
        acc_m[c] = _mm_setzero_ps();
    }
    for (int i = 0; i < nb; ++i) {
        const float xd = GGML_CPU_FP16_TO_FP32(x[i].d);
        const float xdmin = GGML_CPU_FP16_TO_FP32(x[i].dmin);

        __m128i mins;
        __m256i scales;
        pl_k_scales_mins(x[i].scales, &mins, &scales);

        __m256i sumi[PL_COLS_STEP];
        for (int c = 0; c < nc; ++c) {
            sumi[c] = _mm256_setzero_si256();
        }
        const uint8_t * GGML_RESTRICT q4 = x[i].qs;
        for (int j = 0; j < QK_K/64; ++j) {
            const __m256i scale_l = _mm256_shuffle_epi8(scales, get_scale_shuffle_k4(2*j+0));
            const __m256i scale_h = _mm256_shuffle_epi8(scales, get_scale_shuffle_k4(2*j+1));
            const __m256i q4bits = _mm256_loadu_si256((const __m256i*)(q4 + 32*j));
            const __m256i q4l = _mm256_and_si256(q4bits, m4);
            const __m256i q4h = _mm256_and_si256(_mm256_srli_epi16(q4bits, 4), m4);
            for (int c = 0; c < nc; ++c) {
                const int8_t * GGML_RESTRICT q8 = t->y[c][i].qs + 64*j;
                __m256i p16l = _mm256_maddubs_epi16(q4l, _mm256_loadu_si256((const __m256i*)q8));
                p16l = _mm256_madd_epi16(scale_l, p16l);
                __m256i p16h = _mm256_maddubs_epi16(q4h, _mm256_loadu_si256((const __m256i*)(q8 + 32)));
                p16h = _mm256_madd_epi16(scale_h, p16h);
                sumi[c] = _mm256_add_epi32(sumi[c], _mm256_add_epi32(p16l, p16h));
            }
        }
        for (int c = 0; c < nc; ++c) {
            const float yd = t->y[c][i].d;
            const float d = yd * xd;
            const float dmin = -yd * xdmin;
            const __m128i prod = _mm_madd_epi16(mins, t->q8s[i][c]);
            acc_m[c] = _mm_fmadd_ps(_mm_set1_ps(dmin), _mm_cvtepi32_ps(prod), acc_m[c]);
            acc[c] = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi[c]), acc[c]);
        }
    }
    for (int c = 0; c < nc; ++c) {
        __m128 m = acc_m[c];
        m = _mm_add_ps(m, _mm_movehl_ps(m, m));
        m = _mm_add_ss(m, _mm_movehdup_ps(m));
        *s[c] = hsum_float_8(acc[c]) + _mm_cvtss_f32(m);
    }
}

static inline __attribute__((always_inline)) void pl_q6_K_cols(const int nb, float * const * GGML_RESTRICT s,
        const block_q6_K * GGML_RESTRICT x, const pl_cols_k * GGML_RESTRICT t, const int nc) {
    const __m256i m3 = _mm256_set1_epi8(3);
    const __m256i m15 = _mm256_set1_epi8(15);
    __m256 acc[PL_COLS_STEP];
    for (int c = 0; c < nc; ++c) {
        acc[c] = _mm256_setzero_ps();
    }
    for (int i = 0; i < nb; ++i) {
        const float xd = GGML_CPU_FP16_TO_FP32(x[i].d);
        const uint8_t * GGML_RESTRICT q4 = x[i].ql;
        const uint8_t * GGML_RESTRICT qh = x[i].qh;
        const __m128i scales = _mm_loadu_si128((const __m128i*)x[i].scales);
        const __m256i scales_16 = _mm256_cvtepi8_epi16(scales);

        __m256i sumi[PL_COLS_STEP];
        for (int c = 0; c < nc; ++c) {
            sumi[c] = _mm256_setzero_si256();
        }
        for (int j = 0; j < QK_K/128; ++j) {
            const __m256i q4bits1 = _mm256_loadu_si256((const __m256i*)(q4 + 64*j));
            const __m256i q4bits2 = _mm256_loadu_si256((const __m256i*)(q4 + 64*j + 32));
            const __m256i q4bitsH = _mm256_loadu_si256((const __m256i*)(qh + 32*j));

            const __m256i q4h_0 = _mm256_slli_epi16(_mm256_and_si256(q4bitsH, m3), 4);
            const __m256i q4h_1 = _mm256_slli_epi16(_mm256_and_si256(q4bitsH, _mm256_set1_epi8(12)), 2);
            const __m256i q4h_2 = _mm256_and_si256(q4bitsH, _mm256_set1_epi8(48));
            const __m256i q4h_3 = _mm256_srli_epi16(_mm256_and_si256(q4bitsH, _mm256_set1_epi8(-64)), 2);

            const __m256i q4_0 = _mm256_or_si256(_mm256_and_si256(q4bits1, m15), q4h_0);
            const __m256i q4_1 = _mm256_or_si256(_mm256_and_si256(q4bits2, m15), q4h_1);
            const __m256i q4_2 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(q4bits1, 4), m15), q4h_2);
            const __m256i q4_3 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(q4bits2, 4), m15), q4h_3);

            const __m256i scale_0 = _mm256_cvtepi8_epi16(_mm_shuffle_epi8(scales, get_scale_shuffle(4*j + 0)));
            const __m256i scale_1 = _mm256_cvtepi8_epi16(_mm_shuffle_epi8(scales, get_scale_shuffle(4*j + 1)));
            const __m256i scale_2 = _mm256_cvtepi8_epi16(_mm_shuffle_epi8(scales, get_scale_shuffle(4*j + 2)));
            const __m256i scale_3 = _mm256_cvtepi8_epi16(_mm_shuffle_epi8(scales, get_scale_shuffle(4*j + 3)));

            for (int c = 0; c < nc; ++c) {
                const int8_t * GGML_RESTRICT q8 = t->y[c][i].qs + 128*j;
                const __m256i p16_0 = _mm256_madd_epi16(scale_0,
                    _mm256_maddubs_epi16(q4_0, _mm256_loadu_si256((const __m256i*)(q8 +  0))));
                const __m256i p16_1 = _mm256_madd_epi16(scale_1,
                    _mm256_maddubs_epi16(q4_1, _mm256_loadu_si256((const __m256i*)(q8 + 32))));
                const __m256i p16_2 = _mm256_madd_epi16(scale_2,
                    _mm256_maddubs_epi16(q4_2, _mm256_loadu_si256((const __m256i*)(q8 + 64))));
                const __m256i p16_3 = _mm256_madd_epi16(scale_3,
                    _mm256_maddubs_epi16(q4_3, _mm256_loadu_si256((const __m256i*)(q8 + 96))));
                sumi[c] = _mm256_add_epi32(sumi[c], _mm256_add_epi32(p16_0, p16_1));
                sumi[c] = _mm256_add_epi32(sumi[c], _mm256_add_epi32(p16_2, p16_3));
            }
        }
        for (int c = 0; c < nc; ++c) {
            const float d = t->y[c][i].d * xd;
            const __m256i q8sums = _mm256_loadu_si256((const __m256i*)t->y[c][i].bsums);
            const __m256i q8sclsub = _mm256_slli_epi32(_mm256_madd_epi16(q8sums, scales_16), 5);
            const __m256i sum = _mm256_sub_epi32(sumi[c], q8sclsub);
            acc[c] = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sum), acc[c]);
        }
    }
    for (int c = 0; c < nc; ++c) {
        *s[c] = hsum_float_8(acc[c]);
    }
}

// Q5_K: Q4_K's layout with a fifth bit per quant in qh; its mins go through a scalar sum per block
// (upstream's summs), not a vector accumulator as Q4_K's do
static inline __attribute__((always_inline)) void pl_q5_K_cols(const int nb, float * const * GGML_RESTRICT s,
        const block_q5_K * GGML_RESTRICT x, const pl_cols_k * GGML_RESTRICT t, const int nc) {
    const __m256i m4 = _mm256_set1_epi8(0xF);
    const __m128i mzero = _mm_setzero_si128();
    const __m256i mone  = _mm256_set1_epi8(1);
    __m256 acc[PL_COLS_STEP];
    float summs[PL_COLS_STEP];
    for (int c = 0; c < nc; ++c) {
        acc[c] = _mm256_setzero_ps();
        summs[c] = 0.f;
    }
    for (int i = 0; i < nb; ++i) {
        const float xd = GGML_CPU_FP16_TO_FP32(x[i].d);
        const float xdmin = GGML_CPU_FP16_TO_FP32(x[i].dmin);

        __m128i mins;
        __m256i scales;
        pl_k_scales_mins(x[i].scales, &mins, &scales);

        const __m256i hbits = _mm256_loadu_si256((const __m256i*)x[i].qh);
        __m256i hmask = mone;

        __m256i sumi[PL_COLS_STEP];
        for (int c = 0; c < nc; ++c) {
            sumi[c] = _mm256_setzero_si256();
        }
        const uint8_t * GGML_RESTRICT q5 = x[i].qs;
        int bit = 0;
        for (int j = 0; j < QK_K/64; ++j) {
            const __m256i scale_0 = _mm256_shuffle_epi8(scales, get_scale_shuffle_k4(2*j+0));
            const __m256i scale_1 = _mm256_shuffle_epi8(scales, get_scale_shuffle_k4(2*j+1));
            const __m256i q5bits = _mm256_loadu_si256((const __m256i*)(q5 + 32*j));

            const __m256i q5l_0 = _mm256_and_si256(q5bits, m4);
            const __m256i q5h_0 = _mm256_slli_epi16(_mm256_srli_epi16(_mm256_and_si256(hbits, hmask), bit++), 4);
            const __m256i q5_0  = _mm256_add_epi8(q5l_0, q5h_0);
            hmask = _mm256_slli_epi16(hmask, 1);

            const __m256i q5l_1 = _mm256_and_si256(_mm256_srli_epi16(q5bits, 4), m4);
            const __m256i q5h_1 = _mm256_slli_epi16(_mm256_srli_epi16(_mm256_and_si256(hbits, hmask), bit++), 4);
            const __m256i q5_1  = _mm256_add_epi8(q5l_1, q5h_1);
            hmask = _mm256_slli_epi16(hmask, 1);

            for (int c = 0; c < nc; ++c) {
                const int8_t * GGML_RESTRICT q8 = t->y[c][i].qs + 64*j;
                __m256i p16_0 = _mm256_maddubs_epi16(q5_0, _mm256_loadu_si256((const __m256i*)q8));
                __m256i p16_1 = _mm256_maddubs_epi16(q5_1, _mm256_loadu_si256((const __m256i*)(q8 + 32)));
                p16_0 = _mm256_madd_epi16(scale_0, p16_0);
                p16_1 = _mm256_madd_epi16(scale_1, p16_1);
                sumi[c] = _mm256_add_epi32(sumi[c], _mm256_add_epi32(p16_0, p16_1));
            }
        }
        for (int c = 0; c < nc; ++c) {
            const float yd = t->y[c][i].d;
            const float d = yd * xd;
            const float dmin = -yd * xdmin;
            const __m128i prod = _mm_madd_epi16(mins, t->q8s[i][c]);
            const __m128i hsum = _mm_hadd_epi32(_mm_hadd_epi32(prod, mzero), mzero);
            summs[c] += dmin * _mm_extract_epi32(hsum, 0);
            acc[c] = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi[c]), acc[c]);
        }
    }
    for (int c = 0; c < nc; ++c) {
        *s[c] = hsum_float_8(acc[c]) + summs[c];
    }
}

// Q3_K and Q2_K share their scales' layout (sixteen 16-bit scales per super-block, each 128-bit
// lane holding eight), their four scale shuffles per 128 values, the way four 32-value products are
// scaled and summed, and their one fused multiply-add per super-block
static inline __attribute__((always_inline)) void pl_scales_16_lanes(const __m128i scales8, __m256i scales[2]) {
    const __m256i all_scales = _mm256_cvtepi8_epi16(scales8);
    const __m128i l_scales = _mm256_extracti128_si256(all_scales, 0);
    const __m128i h_scales = _mm256_extracti128_si256(all_scales, 1);
    scales[0] = MM256_SET_M128I(l_scales, l_scales);
    scales[1] = MM256_SET_M128I(h_scales, h_scales);
}

static inline __attribute__((always_inline)) void pl_q3k_shuffles(const __m256i scales, __m256i scale[4]) {
    for (int k = 0; k < 4; ++k) {
        scale[k] = _mm256_shuffle_epi8(scales, get_scale_shuffle_q3k(k));
    }
}

static inline __attribute__((always_inline)) __m256i pl_scaled_sum4(const __m256i sumi, const __m256i scale[4],
        __m256i p0, __m256i p1, __m256i p2, __m256i p3) {
    p0 = _mm256_madd_epi16(scale[0], p0);
    p1 = _mm256_madd_epi16(scale[1], p1);
    p2 = _mm256_madd_epi16(scale[2], p2);
    p3 = _mm256_madd_epi16(scale[3], p3);
    p0 = _mm256_add_epi32(p0, p1);
    p2 = _mm256_add_epi32(p2, p3);
    return _mm256_add_epi32(sumi, _mm256_add_epi32(p0, p2));
}

#define PL_K_BLOCK_FMA(xd)                                                             \
    for (int c = 0; c < nc; ++c) {                                                     \
        const float d = t->y[c][i].d * (xd);                                           \
        acc[c] = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi[c]), acc[c]); \
    }

// Q3_K: two low bits and a high bit kept apart (the high part subtracted after maddubs), signed
// 6-bit scales, no mins
static inline __attribute__((always_inline)) void pl_q3_K_cols(const int nb, float * const * GGML_RESTRICT s,
        const block_q3_K * GGML_RESTRICT x, const pl_cols_k * GGML_RESTRICT t, const int nc) {
    const uint32_t kmask1 = 0x03030303;
    const uint32_t kmask2 = 0x0f0f0f0f;
    const __m256i m3 = _mm256_set1_epi8(3);
    const __m256i mone = _mm256_set1_epi8(1);
    const __m128i m32 = _mm_set1_epi8(32);
    __m256 acc[PL_COLS_STEP];
    for (int c = 0; c < nc; ++c) {
        acc[c] = _mm256_setzero_ps();
    }
    uint32_t aux[3];
    for (int i = 0; i < nb; ++i) {
        const float xd = GGML_CPU_FP16_TO_FP32(x[i].d);

        memcpy(aux, x[i].scales, 12);
        __m128i scales128 = _mm_set_epi32(
                ((aux[1] >> 4) & kmask2) | (((aux[2] >> 6) & kmask1) << 4),
                ((aux[0] >> 4) & kmask2) | (((aux[2] >> 4) & kmask1) << 4),
                (aux[1] & kmask2) | (((aux[2] >> 2) & kmask1) << 4),
                (aux[0] & kmask2) | (((aux[2] >> 0) & kmask1) << 4));
        scales128 = _mm_sub_epi8(scales128, m32);
        __m256i scales[2];
        pl_scales_16_lanes(scales128, scales);

        const __m256i hbits = _mm256_loadu_si256((const __m256i*)x[i].hmask);

        __m256i sumi[PL_COLS_STEP];
        for (int c = 0; c < nc; ++c) {
            sumi[c] = _mm256_setzero_si256();
        }
        const uint8_t * GGML_RESTRICT q3 = x[i].qs;
        int bit = 0;
        for (int j = 0; j < QK_K/128; ++j) {
            const __m256i q3bits = _mm256_loadu_si256((const __m256i*)(q3 + 32*j));

            const __m256i q3l_0 = _mm256_and_si256(q3bits, m3);
            const __m256i q3h_0 = _mm256_slli_epi16(_mm256_srli_epi16(_mm256_andnot_si256(hbits, _mm256_slli_epi16(mone, bit)), bit), 2);
            ++bit;
            const __m256i q3l_1 = _mm256_and_si256(_mm256_srli_epi16(q3bits, 2), m3);
            const __m256i q3h_1 = _mm256_slli_epi16(_mm256_srli_epi16(_mm256_andnot_si256(hbits, _mm256_slli_epi16(mone, bit)), bit), 2);
            ++bit;
            const __m256i q3l_2 = _mm256_and_si256(_mm256_srli_epi16(q3bits, 4), m3);
            const __m256i q3h_2 = _mm256_slli_epi16(_mm256_srli_epi16(_mm256_andnot_si256(hbits, _mm256_slli_epi16(mone, bit)), bit), 2);
            ++bit;
            const __m256i q3l_3 = _mm256_and_si256(_mm256_srli_epi16(q3bits, 6), m3);
            const __m256i q3h_3 = _mm256_slli_epi16(_mm256_srli_epi16(_mm256_andnot_si256(hbits, _mm256_slli_epi16(mone, bit)), bit), 2);
            ++bit;

            __m256i scale[4];
            pl_q3k_shuffles(scales[j], scale);

            for (int c = 0; c < nc; ++c) {
                const int8_t * GGML_RESTRICT q8 = t->y[c][i].qs + 128*j;
                const __m256i q8_0 = _mm256_loadu_si256((const __m256i*)(q8 +  0));
                const __m256i q8_1 = _mm256_loadu_si256((const __m256i*)(q8 + 32));
                const __m256i q8_2 = _mm256_loadu_si256((const __m256i*)(q8 + 64));
                const __m256i q8_3 = _mm256_loadu_si256((const __m256i*)(q8 + 96));
                sumi[c] = pl_scaled_sum4(sumi[c], scale,
                    _mm256_sub_epi16(_mm256_maddubs_epi16(q3l_0, q8_0), _mm256_maddubs_epi16(q3h_0, q8_0)),
                    _mm256_sub_epi16(_mm256_maddubs_epi16(q3l_1, q8_1), _mm256_maddubs_epi16(q3h_1, q8_1)),
                    _mm256_sub_epi16(_mm256_maddubs_epi16(q3l_2, q8_2), _mm256_maddubs_epi16(q3h_2, q8_2)),
                    _mm256_sub_epi16(_mm256_maddubs_epi16(q3l_3, q8_3), _mm256_maddubs_epi16(q3h_3, q8_3)));
            }
        }
        PL_K_BLOCK_FMA(xd)
    }
    for (int c = 0; c < nc; ++c) {
        *s[c] = hsum_float_8(acc[c]);
    }
}

// Q2_K: two-bit quants with 4-bit scales and minimums; each block's minimums meet the column's
// bsums and go into the same accumulator just before the quants do (upstream's order)
static inline __attribute__((always_inline)) void pl_q2_K_cols(const int nb, float * const * GGML_RESTRICT s,
        const block_q2_K * GGML_RESTRICT x, const pl_cols_k * GGML_RESTRICT t, const int nc) {
    const __m256i m3 = _mm256_set1_epi8(3);
    const __m128i m4 = _mm_set1_epi8(0xF);
    __m256 acc[PL_COLS_STEP];
    for (int c = 0; c < nc; ++c) {
        acc[c] = _mm256_setzero_ps();
    }
    for (int i = 0; i < nb; ++i) {
        const float xd = GGML_CPU_FP16_TO_FP32(x[i].d);
        const float xdmin = GGML_CPU_FP16_TO_FP32(x[i].dmin);

        const __m128i mins_and_scales = _mm_loadu_si128((const __m128i*)x[i].scales);
        const __m128i scales8 = _mm_and_si128(mins_and_scales, m4);
        const __m128i mins8 = _mm_and_si128(_mm_srli_epi16(mins_and_scales, 4), m4);
        const __m256i mins = _mm256_cvtepi8_epi16(mins8);
        for (int c = 0; c < nc; ++c) {
            const float dmin = -t->y[c][i].d * xdmin;
            const __m256i prod = _mm256_madd_epi16(mins, _mm256_loadu_si256((const __m256i*)t->y[c][i].bsums));
            acc[c] = _mm256_fmadd_ps(_mm256_set1_ps(dmin), _mm256_cvtepi32_ps(prod), acc[c]);
        }

        __m256i scales[2];
        pl_scales_16_lanes(scales8, scales);

        __m256i sumi[PL_COLS_STEP];
        for (int c = 0; c < nc; ++c) {
            sumi[c] = _mm256_setzero_si256();
        }
        const uint8_t * GGML_RESTRICT q2 = x[i].qs;
        for (int j = 0; j < QK_K/128; ++j) {
            const __m256i q2bits = _mm256_loadu_si256((const __m256i*)(q2 + 32*j));
            const __m256i q2_0 = _mm256_and_si256(q2bits, m3);
            const __m256i q2_1 = _mm256_and_si256(_mm256_srli_epi16(q2bits, 2), m3);
            const __m256i q2_2 = _mm256_and_si256(_mm256_srli_epi16(q2bits, 4), m3);
            const __m256i q2_3 = _mm256_and_si256(_mm256_srli_epi16(q2bits, 6), m3);
            __m256i scale[4];
            pl_q3k_shuffles(scales[j], scale);
            for (int c = 0; c < nc; ++c) {
                const int8_t * GGML_RESTRICT q8 = t->y[c][i].qs + 128*j;
                sumi[c] = pl_scaled_sum4(sumi[c], scale,
                    _mm256_maddubs_epi16(q2_0, _mm256_loadu_si256((const __m256i*)(q8 +  0))),
                    _mm256_maddubs_epi16(q2_1, _mm256_loadu_si256((const __m256i*)(q8 + 32))),
                    _mm256_maddubs_epi16(q2_2, _mm256_loadu_si256((const __m256i*)(q8 + 64))),
                    _mm256_maddubs_epi16(q2_3, _mm256_loadu_si256((const __m256i*)(q8 + 96))));
            }
        }
        PL_K_BLOCK_FMA(xd)
    }
    for (int c = 0; c < nc; ++c) {
        *s[c] = hsum_float_8(acc[c]);
    }
}

#if PL_COLS_STEP == 8
#define PL_COLS_WIDE(KERNEL, ...)                                                      \
    case 8: KERNEL(__VA_ARGS__, 8); break;                                             \
    case 7: KERNEL(__VA_ARGS__, 7); break;                                             \
    case 6: KERNEL(__VA_ARGS__, 6); break;                                             \
    case 5: KERNEL(__VA_ARGS__, 5); break;
#else
#define PL_COLS_WIDE(KERNEL, ...)
#endif

// rows [r0, r1) against the m columns in TILE: the switch gives the kernel a constant column count,
// so that its sums stay in registers
#define PL_COLS_ROWS(KERNEL, BLOCK, TILE)                                              \
    for (int64_t r = r0; r < r1; ++r) {                                                \
        float * at[PL_COLS_STEP];                                                      \
        for (int c = 0; c < m; ++c) at[c] = outs[c0 + c] + r;                          \
        const BLOCK * row = (const BLOCK *) ((const char *) x + r * x_stride);         \
        switch (m) {                                                                   \
            PL_COLS_WIDE(KERNEL, nb, at, row, TILE)                                    \
            case 4: KERNEL(nb, at, row, TILE, 4); break;                               \
            case 3: KERNEL(nb, at, row, TILE, 3); break;                               \
            case 2: KERNEL(nb, at, row, TILE, 2); break;                               \
            default: KERNEL(nb, at, row, TILE, 1); break;                              \
        }                                                                              \
    }

// the columns split into passes of at most PL_COLS_STEP, as even as they go (9 = 5 + 4, not 8 + 1:
// a pass of one column shares nothing)
#define PL_COLS_PASSES(...)                                                            \
    {                                                                                  \
        const int passes = (nc + PL_COLS_STEP - 1) / PL_COLS_STEP;                     \
        for (int p = 0, c0 = 0; p < passes; ++p) {                                     \
            const int m = (nc - c0) / (passes - p);                                    \
            __VA_ARGS__                                                                \
            c0 += m;                                                                   \
        }                                                                              \
    }
#endif

int ggml_mul_mat_cols(enum ggml_type type, int n, const void * GGML_RESTRICT x, size_t x_stride, int64_t r0,
        int64_t r1, const void * const * GGML_RESTRICT cols, float * const * GGML_RESTRICT outs, int nc) {
#if defined(__AVX2__)
    if (nc < 1) {
        return 0;
    }
    if (type == GGML_TYPE_F16) {
        ggml_vec_dot_f16_cols(n, (const ggml_fp16_t *) x, x_stride, r0, r1, (const ggml_fp16_t * const *) cols, outs, nc);
        return 1;
    }
    if (type == GGML_TYPE_Q2_K || type == GGML_TYPE_Q3_K || type == GGML_TYPE_Q4_K || type == GGML_TYPE_Q5_K ||
            type == GGML_TYPE_Q6_K) {
        const int nb = n / QK_K;
        if (n % QK_K != 0 || nb > PL_COLS_MAX_NBK) {
            return 0;
        }
        pl_cols_k tk;
        PL_COLS_PASSES(
            for (int c = 0; c < m; ++c) {
                tk.y[c] = (const block_q8_K *) cols[c0 + c];
            }
            if (type == GGML_TYPE_Q4_K || type == GGML_TYPE_Q5_K) {
                for (int c = 0; c < m; ++c) {
                    for (int i = 0; i < nb; ++i) {
                        const __m256i q8sums = _mm256_loadu_si256((const __m256i*)tk.y[c][i].bsums);
                        tk.q8s[i][c] = _mm_hadd_epi16(_mm256_extracti128_si256(q8sums, 0),
                                                      _mm256_extracti128_si256(q8sums, 1));
                    }
                }
            }
            if (type == GGML_TYPE_Q4_K) {
                PL_COLS_ROWS(pl_q4_K_cols, block_q4_K, &tk)
            } else if (type == GGML_TYPE_Q5_K) {
                PL_COLS_ROWS(pl_q5_K_cols, block_q5_K, &tk)
            } else if (type == GGML_TYPE_Q6_K) {
                PL_COLS_ROWS(pl_q6_K_cols, block_q6_K, &tk)
            } else if (type == GGML_TYPE_Q3_K) {
                PL_COLS_ROWS(pl_q3_K_cols, block_q3_K, &tk)
            } else {
                PL_COLS_ROWS(pl_q2_K_cols, block_q2_K, &tk)
            }
        )
        return 1;
    }
    const int nb = n / 32;
    if (n % 32 != 0 || nb > PL_COLS_MAX_NB ||
            (type != GGML_TYPE_Q4_1 && type != GGML_TYPE_Q5_1 && type != GGML_TYPE_Q8_0 && type != GGML_TYPE_Q5_0 &&
             type != GGML_TYPE_Q4_0)) {
        return 0;
    }
    pl_cols_block tile[PL_COLS_MAX_NB];
    PL_COLS_PASSES(
        if (type == GGML_TYPE_Q4_1 || type == GGML_TYPE_Q5_1) {
            for (int c = 0; c < m; ++c) {
                const block_q8_1 * y = (const block_q8_1 *) cols[c0 + c];
                for (int ib = 0; ib < nb; ++ib) {
                    memcpy(tile[ib].q[c], y[ib].qs, 32);
                    tile[ib].d[c] = GGML_CPU_FP16_TO_FP32(y[ib].d);
                    tile[ib].s[c] = GGML_CPU_FP16_TO_FP32(y[ib].s);
                }
            }
            if (type == GGML_TYPE_Q4_1) {
                PL_COLS_ROWS(pl_q4_1_cols, block_q4_1, tile)
            } else {
                PL_COLS_ROWS(pl_q5_1_cols, block_q5_1, tile)
            }
        } else {
            for (int c = 0; c < m; ++c) {
                const block_q8_0 * y = (const block_q8_0 *) cols[c0 + c];
                for (int ib = 0; ib < nb; ++ib) {
                    memcpy(tile[ib].q[c], y[ib].qs, 32);
                    tile[ib].d[c] = GGML_CPU_FP16_TO_FP32(y[ib].d);
                }
            }
            if (type == GGML_TYPE_Q8_0) {
                PL_COLS_ROWS(pl_q8_0_cols, block_q8_0, tile)
            } else if (type == GGML_TYPE_Q5_0) {
                PL_COLS_ROWS(pl_q5_0_cols, block_q5_0, tile)
            } else {
                PL_COLS_ROWS(pl_q4_0_cols, block_q4_0, tile)
            }
        }
    )
    return 1;
#else
    UNUSED(type); UNUSED(n); UNUSED(x); UNUSED(x_stride); UNUSED(r0); UNUSED(r1); UNUSED(cols); UNUSED(outs);
    UNUSED(nc);
    return 0;
#endif
}
