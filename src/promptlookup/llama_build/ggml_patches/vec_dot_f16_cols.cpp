// promptlookup: rows [r0, r1) of an F16 matrix (row stride x_stride bytes) against nc F16 columns (the
// attention's K and V against a batch's queries and weights). Each result is ggml_vec_dot_f16's: the
// same SIMD macros, loads, fused multiply-adds, reduction and leftovers, per (row, column), so the
// bits do not depend on the batch; a row's values are loaded once for several columns.
#if defined(GGML_SIMD) && !defined(__ARM_FEATURE_SVE) && !defined(__riscv_v_intrinsic)
#if defined(__AVX512F__)
#define PL_F16_COLS 4
#else
#define PL_F16_COLS 2
#endif
#endif

void ggml_vec_dot_f16_cols(int n, const ggml_fp16_t * GGML_RESTRICT x, size_t x_stride, int64_t r0, int64_t r1,
        const ggml_fp16_t * const * GGML_RESTRICT y, float * const * GGML_RESTRICT s, int nc) {
#if defined(PL_F16_COLS)
    const int np = (n & ~(GGML_F16_DOT_STEP - 1));
    for (int c0 = 0; c0 < nc; c0 += PL_F16_COLS) {
        const int m = nc - c0 < PL_F16_COLS ? nc - c0 : PL_F16_COLS;
        for (int64_t r = r0; r < r1; ++r) {
            const ggml_fp16_t * GGML_RESTRICT xr = (const ggml_fp16_t *) ((const char *) x + r * x_stride);
            GGML_F16_DOT_VEC sum[PL_F16_COLS][GGML_F16_DOT_ARR];
            for (int c = 0; c < m; ++c) {
                for (int j = 0; j < GGML_F16_DOT_ARR; j++) {
                    sum[c][j] = GGML_F16_DOT_VEC_ZERO;
                }
            }
            for (int i = 0; i < np; i += GGML_F16_DOT_STEP) {
                for (int j = 0; j < GGML_F16_DOT_ARR; j++) {
                    const GGML_F16_DOT_VEC ax = GGML_F16_DOT_VEC_LOAD(xr + i + j*GGML_F16_DOT_EPR, j);
                    for (int c = 0; c < m; ++c) {
                        const GGML_F16_DOT_VEC ay = GGML_F16_DOT_VEC_LOAD(y[c0 + c] + i + j*GGML_F16_DOT_EPR, j);
                        sum[c][j] = GGML_F16_DOT_VEC_FMA(sum[c][j], ax, ay);
                    }
                }
            }
            for (int c = 0; c < m; ++c) {
                ggml_float sumf = 0.0;
                GGML_F16_DOT_VEC_REDUCE(sumf, sum[c]);
                for (int i = np; i < n; ++i) {
                    sumf += (ggml_float)(GGML_CPU_FP16_TO_FP32(xr[i])*GGML_CPU_FP16_TO_FP32(y[c0 + c][i]));
                }
                s[c0 + c][r] = sumf;
            }
        }
    }
#else
    for (int c = 0; c < nc; ++c) {
        for (int64_t r = r0; r < r1; ++r) {
            ggml_vec_dot_f16(n, &s[c][r], 0, (ggml_fp16_t *) ((const char *) x + r * x_stride), 0,
                             (ggml_fp16_t *) y[c], 0, 1);
        }
    }
#endif
}
