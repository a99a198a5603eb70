//go:build amd64 && !purego

#include "textflag.h"

// RANGE sets each byte of dst to 0xFF where the byte of src, less lo, is
// at most span (unsigned): src in [lo, lo+span]. Y3 is clobbered.
#define RANGE(lo, span, src, dst) \
	VPSUBB   lo, src, dst  \
	VPMINUB  span, dst, Y3 \
	VPCMPEQB Y3, dst, dst

// HALF computes the ten class masks of the 32 bytes at off(SI) into bits
// h*32.. of the ten uint64 fields at (DI) (see blockMasks).
#define HALF(off, h) \
	VMOVDQU    off(SI), Y0              \
	VPMOVMSKB  Y0, AX                   \
	MOVL       AX, (0*8+4*h)(DI)        \
	VPADDB     Y0, Y0, Y2               \
	VPMOVMSKB  Y2, AX                   \
	MOVL       AX, (1*8+4*h)(DI)        \
	RANGE(Y5, Y6, Y0, Y2)               \
	VPMOVMSKB  Y2, AX                   \
	MOVL       AX, (2*8+4*h)(DI)        \
	VPOR       Y4, Y0, Y1               \
	RANGE(Y7, Y8, Y1, Y2)               \
	VPMOVMSKB  Y2, AX                   \
	MOVL       AX, (3*8+4*h)(DI)        \
	RANGE(Y7, Y10, Y1, Y2)              \
	VPMOVMSKB  Y2, AX                   \
	MOVL       AX, (4*8+4*h)(DI)        \
	RANGE(Y9, Y8, Y0, Y2)               \
	VPMOVMSKB  Y2, AX                   \
	MOVL       AX, (5*8+4*h)(DI)        \
	VPCMPEQB   Y11, Y0, Y2              \
	VPMOVMSKB  Y2, AX                   \
	MOVL       AX, (6*8+4*h)(DI)        \
	VPCMPEQB   Y4, Y0, Y2               \
	VPMOVMSKB  Y2, AX                   \
	MOVL       AX, (7*8+4*h)(DI)        \
	VPCMPEQB   Y12, Y0, Y2              \
	VPMOVMSKB  Y2, AX                   \
	MOVL       AX, (8*8+4*h)(DI)        \
	VPCMPEQB   Y13, Y0, Y2              \
	VPCMPEQB   Y14, Y0, Y3              \
	VPOR       Y3, Y2, Y2               \
	VPCMPEQB   Y15, Y0, Y3              \
	VPOR       Y3, Y2, Y2               \
	VPCMPEQB   underscores<>(SB), Y0, Y3 \
	VPOR       Y3, Y2, Y2               \
	VPMOVMSKB  Y2, AX                   \
	MOVL       AX, (9*8+4*h)(DI)

// BCAST sets every byte of y to c (x is y's lower half).
#define BCAST(c, y, x) \
	MOVQ         $c, AX \
	VMOVQ        AX, x  \
	VPBROADCASTB x, y

// underscores is 32 bytes of '_'.
DATA underscores<>+0(SB)/8, $0x5F5F5F5F5F5F5F5F
DATA underscores<>+8(SB)/8, $0x5F5F5F5F5F5F5F5F
DATA underscores<>+16(SB)/8, $0x5F5F5F5F5F5F5F5F
DATA underscores<>+24(SB)/8, $0x5F5F5F5F5F5F5F5F
GLOBL underscores<>(SB), RODATA|NOPTR, $32

// func classMasksAVX2(p *byte, n int, out *blockMasks)
TEXT ·classMasksAVX2(SB), NOSPLIT, $0-24
	MOVQ p+0(FP), SI
	MOVQ n+8(FP), CX
	MOVQ out+16(FP), DI
	BCAST(0x20, Y4, X4)   // the case bit, and ' '
	BCAST(0x30, Y5, X5)   // '0'
	BCAST(9, Y6, X6)      // '9'-'0'
	BCAST(0x61, Y7, X7)   // 'a'
	BCAST(25, Y8, X8)     // 'z'-'a'
	BCAST(0x41, Y9, X9)   // 'A'
	BCAST(5, Y10, X10)    // 'f'-'a'
	BCAST(0x3A, Y11, X11) // ':'
	BCAST(0x40, Y12, X12) // '@'
	BCAST(0x2B, Y13, X13) // '+'
	BCAST(0x2D, Y14, X14) // '-'
	BCAST(0x2F, Y15, X15) // '/'
	TESTQ CX, CX
	JZ    done

loop:
	HALF(0, 0)
	HALF(32, 1)
	ADDQ $64, SI
	ADDQ $80, DI
	DECQ CX
	JNZ  loop

done:
	VZEROUPPER
	RET

// keyShuffle picks, for the eight offsets j of a group, the bytes j, j+1
// and j+2 of T (both 128-bit lanes hold T's 16 bytes) into dword j.
DATA keyShuffle<>+0(SB)/8, $0x8003020180020100
DATA keyShuffle<>+8(SB)/8, $0x8005040380040302
DATA keyShuffle<>+16(SB)/8, $0x8007060580060504
DATA keyShuffle<>+24(SB)/8, $0x8009080780080706
GLOBL keyShuffle<>(SB), RODATA|NOPTR, $32

// GROUP sets bits 8g..8g+7 of BX to the filter bits of the keys of the
// eight offsets at 8g(SI).
#define GROUP(g) \
	VMOVDQU     (8*g-1)(SI), X0          \
	VMOVDQU     (8*g)(SI), X1            \
	VPOR        X4, X0, X0               \
	VPSUBB      X5, X0, X0               \
	VPMINUB     X6, X0, X2               \
	VPCMPEQB    X2, X0, X0               \
	VPANDN      X4, X0, X0               \
	VPOR        X4, X1, X1               \
	VPXOR       X0, X1, X1               \
	VINSERTI128 $1, X1, Y1, Y1           \
	VPSHUFB     Y7, Y1, Y1               \
	VPMULLD     Y8, Y1, Y1               \
	VPSRLD      $16, Y1, Y1              \
	VPSRLD      $5, Y1, Y2               \
	VPAND       Y9, Y1, Y1               \
	VMOVDQA     Y10, Y3                  \
	VPXOR       Y11, Y11, Y11            \
	VPGATHERDD  Y3, (DX)(Y2*4), Y11      \
	VPSRLVD     Y1, Y11, Y11             \
	VPSLLD      $31, Y11, Y11            \
	VMOVMSKPS   Y11, AX                  \
	SHLQ        $(8*g), AX               \
	ORQ         AX, BX

// func kwCandAVX2(p *byte, n int, filter *uint64, out *uint64)
TEXT ·kwCandAVX2(SB), NOSPLIT, $0-32
	MOVQ p+0(FP), SI
	MOVQ n+8(FP), CX
	MOVQ filter+16(FP), DX
	MOVQ out+24(FP), DI
	BCAST(0x20, Y4, X4)
	BCAST(0x61, Y5, X5)
	BCAST(25, Y6, X6)
	VMOVDQU keyShuffle<>(SB), Y7
	MOVQ         $0x9E3779B1, AX
	VMOVQ        AX, X8
	VPBROADCASTD X8, Y8
	MOVQ         $31, AX
	VMOVQ        AX, X9
	VPBROADCASTD X9, Y9
	VPCMPEQD     Y10, Y10, Y10
	TESTQ CX, CX
	JZ    kwdone

kwloop:
	XORQ BX, BX
	GROUP(0)
	GROUP(1)
	GROUP(2)
	GROUP(3)
	GROUP(4)
	GROUP(5)
	GROUP(6)
	GROUP(7)
	MOVQ BX, (DI)
	ADDQ $8, DI
	ADDQ $64, SI
	DECQ CX
	JNZ  kwloop

kwdone:
	VZEROUPPER
	RET
