#if defined(__AVX2__) && (defined(__x86_64__) || defined(_M_X64))
    // promptlookup: every row of the chunk against a block of columns at once (ggml_mul_mat_cols): the
    // same result for every (row, column) as the loop below, with what the columns share done once
    if ((type == GGML_TYPE_Q4_1 || type == GGML_TYPE_Q8_0) && num_rows_per_vec_dot == 1 && ne02 == 1 && ne03 == 1) {
        const void * cols[16];
        float * outs[16];
        int64_t iir1 = ir1_start;
        for (; iir1 < ir1_end; iir1 += blck_1) {
            const int nc = (int) (MIN(iir1 + blck_1, ir1_end) - iir1);
            for (int c = 0; c < nc; ++c) {
                const int64_t ir1 = iir1 + c;
                const int64_t i13 = (ir1 / (ne12 * ne1));
                const int64_t i12 = (ir1 - i13 * ne12 * ne1) / ne1;
                const int64_t i11 = (ir1 - i13 * ne12 * ne1 - i12 * ne1);
                cols[c] = (const char*)wdata +
                    (src1_cont || src1->type != vec_dot_type
                        ? (i11 + i12 * ne11 + i13 * ne12 * ne11) * row_size
                        : (i11 * nb11 + i12 * nb12 + i13 * nb13));
                outs[c] = (float*)((char*)dst->data + (i11 * nb1 + i12 * nb2 + i13 * nb3));
            }
            if (!ggml_mul_mat_cols(type, (int) ne00, src0->data, nb01, ir0_start, ir0_end, cols, outs, nc)) {
                break;  // not for this matrix (the check is the same for every block): the loop below
            }
        }
        if (iir1 >= ir1_end) {
            return;
        }
    }
#endif
