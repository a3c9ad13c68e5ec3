// What both AMX tile kernels need (included by int4_amx.c and int8_amx.c): the process's
// permission to use the tiles and the tile configuration's layout.
#ifndef SPECLANE_AMX_H
#define SPECLANE_AMX_H

#include <stdint.h>
#include <sys/syscall.h>
#include <unistd.h>

#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA 18

// Linux hands out the tile registers' state only to a process that asks (once, for all
// its threads). Returns 0 when the tiles may be used.
int amx_init(void) { return (int)syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA); }

// LDTILECFG's 64 bytes: palette 1, then per tile its bytes per row and rows.
typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} tile_config;

#endif
