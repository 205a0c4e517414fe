/* src/core/crc32c.h - the checksum that guards every stored record.
 *
 * CRC32C (Castagnoli, reflected polynomial 0x82F63B78), the checksum of
 * iSCSI, ext4 and RocksDB: x86-64 computes it with one instruction per 8
 * bytes (SSE4.2), so checking a record costs far less than copying it.
 * Implemented in src/core/record.c, its only user; declared here so that
 * tests can compare the hardware path with the portable one.
 */
#ifndef IDEM_CORE_CRC32C_H
#define IDEM_CORE_CRC32C_H

#include <stddef.h>
#include <stdint.h>

/** Extend crc (0 to start) by len bytes at buf: the standard CRC32C, so
 * idem__crc32c(0, "123456789", 9) == 0xE3069283. */
uint32_t idem__crc32c(uint32_t crc, const void *buf, size_t len);

/** The same, always by table (what machines without SSE4.2 run). */
uint32_t idem__crc32c_portable(uint32_t crc, const void *buf, size_t len);

#endif /* IDEM_CORE_CRC32C_H */
