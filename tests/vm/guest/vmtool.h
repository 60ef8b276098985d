/*
 * What vmtool.c (the pages, the other commands) and walk.c (the starved family's walks) share.
 */
#ifndef VMTOOL_H
#define VMTOOL_H

#include <stddef.h>
#include <stdint.h>

#define PAGE 4096

/* pages: each a pure function of (seed, index) */
uint64_t splitmix(uint64_t x);
void gen_page(unsigned char *p, uint64_t seed, uint64_t index);
unsigned char *fill(size_t len, uint64_t seed);
/* mismatches reported so far (the first ten are named) */
extern int reports;

double now(void);
long status_kb(const char *field);
uint64_t num(const char *s);

int cmd_walk(uint64_t mib, uint64_t seed, int passes, const char *shape);
int cmd_phases(uint64_t mib, uint64_t seed, int passes, int n, const char *stagger);

#endif
