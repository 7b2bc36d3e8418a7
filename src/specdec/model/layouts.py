"""The layouts a quantized weight row can be in (quant.py packs them, qkernels.c's FMT_ enums read them): their
numbers, and the K-quant ones' bytes per super-block. A module of its own, so that the kernels and the packer
both take them from here without importing each other."""

U4M, U8M, I8, Q4K, Q5K, Q6K, Q4KX8, Q6KX8, Q80X8, Q50X8, Q40X8, Q41X8 = 0, 1, 2, 4, 5, 6, 7, 8, 9, 10, 11, 12
Q5KX8, Q51X8 = 19, 21
# qkernels_x16.h: the layouts 16 rows wide, for AVX-512
Q4KX16, Q6KX16, Q80X16, Q50X16, Q40X16, Q41X16, Q5KX16, Q51X16 = 13, 14, 15, 16, 17, 18, 20, 22
# bytes per 256 values and row
SUPER_BLOCK = {Q4K: 144, Q5K: 176, Q6K: 210, Q4KX8: 148, Q6KX8: 210, Q4KX16: 148, Q6KX16: 210, Q5KX8: 180, Q5KX16: 180}
K_LAYOUTS = tuple(SUPER_BLOCK)  # the K-quant layouts: their activations are q8_K (kernels._activation_forms)
