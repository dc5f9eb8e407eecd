// promptlookup: a block of weight rows against a block of activation columns (a batch's tokens).
// For every (row, column) pair the operations are those of ggml_vec_dot_q4_1_q8_1 /
// ggml_vec_dot_q8_0_q8_0 above, with the same helpers in the same order, so each result equals the
// one-column kernel's bit for bit whatever else is in the batch. What the columns share is done once:
// a row's quants are unpacked and its scales converted once per block for all the columns, and the
// columns are packed once per tile (their quants side by side, their scales as floats), so the inner
// loop reads one stream at constant offsets.
#if defined(__AVX2__)
#if defined(__AVX512VL__)
#define PL_COLS_STEP 8      // columns per pass over the rows: 32 vector registers hold their sums
#else
#define PL_COLS_STEP 4
#endif
#define PL_COLS_MAX_NB 128  // blocks of a row (4096 values) a packed tile holds: 40 KB of stack

typedef struct {
    int8_t q[PL_COLS_STEP][32];  // each column's quants of this block
    float d[PL_COLS_STEP];       // its scale
    float s[PL_COLS_STEP];       // its scaled sum (Q8_1 only)
} pl_cols_block;

static inline __attribute__((always_inline)) void pl_q4_1_cols(const int nb, float * const * GGML_RESTRICT s,
        const block_q4_1 * GGML_RESTRICT x, const pl_cols_block * GGML_RESTRICT t, const int nc) {
    __m256 acc[PL_COLS_STEP];
    float summs[PL_COLS_STEP];
    for (int c = 0; c < nc; ++c) {
        acc[c] = _mm256_setzero_ps();
        summs[c] = 0;
    }
    for (int ib = 0; ib < nb; ++ib) {
        const float d0 = GGML_CPU_FP16_TO_FP32(x[ib].d);
        const float m0 = GGML_CPU_FP16_TO_FP32(x[ib].m);
        const __m256 d0v = _mm256_set1_ps( d0 );
        const __m256i qx = bytes_from_nibbles_32(x[ib].qs);
        for (int c = 0; c < nc; ++c) {
            summs[c] += m0 * t[ib].s[c];
            const __m256 d0d1 = _mm256_mul_ps( d0v, _mm256_set1_ps( t[ib].d[c] ) );
            const __m256i qy = _mm256_loadu_si256( (const __m256i *)t[ib].q[c] );
            const __m256 xy = mul_sum_us8_pairs_float(qx, qy);
            acc[c] = _mm256_fmadd_ps( d0d1, xy, acc[c] );
        }
    }
    for (int c = 0; c < nc; ++c) {
        *s[c] = hsum_float_8(acc[c]) + summs[c];
    }
}

static inline __attribute__((always_inline)) void pl_q8_0_cols(const int nb, float * const * GGML_RESTRICT s,
        const block_q8_0 * GGML_RESTRICT x, const pl_cols_block * GGML_RESTRICT t, const int nc) {
    __m256 acc[PL_COLS_STEP];
    for (int c = 0; c < nc; ++c) {
        acc[c] = _mm256_setzero_ps();
    }
    for (int ib = 0; ib < nb; ++ib) {
        const float d0 = GGML_CPU_FP16_TO_FP32(x[ib].d);
        const __m256i qx = _mm256_loadu_si256((const __m256i *)x[ib].qs);
        for (int c = 0; c < nc; ++c) {
            const __m256 d = _mm256_set1_ps(d0 * t[ib].d[c]);
            const __m256i qy = _mm256_loadu_si256((const __m256i *)t[ib].q[c]);
            const __m256 q = mul_sum_i8_pairs_float(qx, qy);
            acc[c] = _mm256_fmadd_ps( d, q, acc[c] );
        }
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

// rows [r0, r1) against the m columns packed in tile: the switch gives the kernel a constant column
// count, so that its sums stay in registers
#define PL_COLS_ROWS(KERNEL, BLOCK)                                                    \
    for (int64_t r = r0; r < r1; ++r) {                                                \
        float * at[PL_COLS_STEP];                                                      \
        for (int c = 0; c < m; ++c) at[c] = outs[c0 + c] + r;                          \
        const BLOCK * row = (const BLOCK *) ((const char *) x + r * x_stride);         \
        switch (m) {                                                                   \
            PL_COLS_WIDE(KERNEL, nb, at, row, tile)                                    \
            case 4: KERNEL(nb, at, row, tile, 4); break;                               \
            case 3: KERNEL(nb, at, row, tile, 3); break;                               \
            case 2: KERNEL(nb, at, row, tile, 2); break;                               \
            default: KERNEL(nb, at, row, tile, 1); break;                              \
        }                                                                              \
    }
#endif

int ggml_mul_mat_cols(enum ggml_type type, int n, const void * GGML_RESTRICT x, size_t x_stride, int64_t r0,
        int64_t r1, const void * const * GGML_RESTRICT cols, float * const * GGML_RESTRICT outs, int nc) {
#if defined(__AVX2__)
    const int nb = n / 32;
    if (nc < 1 || n % 32 != 0 || nb > PL_COLS_MAX_NB || (type != GGML_TYPE_Q4_1 && type != GGML_TYPE_Q8_0)) {
        return 0;
    }
    pl_cols_block tile[PL_COLS_MAX_NB];
    for (int c0 = 0; c0 < nc; c0 += PL_COLS_STEP) {
        const int m = nc - c0 < PL_COLS_STEP ? nc - c0 : PL_COLS_STEP;
        if (type == GGML_TYPE_Q4_1) {
            for (int c = 0; c < m; ++c) {
                const block_q8_1 * y = (const block_q8_1 *) cols[c0 + c];
                for (int ib = 0; ib < nb; ++ib) {
                    memcpy(tile[ib].q[c], y[ib].qs, 32);
                    tile[ib].d[c] = GGML_CPU_FP16_TO_FP32(y[ib].d);
                    tile[ib].s[c] = GGML_CPU_FP16_TO_FP32(y[ib].s);
                }
            }
            PL_COLS_ROWS(pl_q4_1_cols, block_q4_1)
        } else {
            for (int c = 0; c < m; ++c) {
                const block_q8_0 * y = (const block_q8_0 *) cols[c0 + c];
                for (int ib = 0; ib < nb; ++ib) {
                    memcpy(tile[ib].q[c], y[ib].qs, 32);
                    tile[ib].d[c] = GGML_CPU_FP16_TO_FP32(y[ib].d);
                }
            }
            PL_COLS_ROWS(pl_q8_0_cols, block_q8_0)
        }
    }
    return 1;
#else
    UNUSED(type); UNUSED(n); UNUSED(x); UNUSED(x_stride); UNUSED(r0); UNUSED(r1); UNUSED(cols); UNUSED(outs);
    UNUSED(nc);
    return 0;
#endif
}
