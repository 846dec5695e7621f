// CRC32C (Castagnoli), the checksum checkpoints carry for every tensor: the
// same polynomial as TensorFlow's table files, iSCSI and ext4.
#ifndef SHOAL_CORE_CRC32C_H_
#define SHOAL_CORE_CRC32C_H_

#include <cstddef>
#include <cstdint>

namespace shoal {

// The CRC32C of `size` bytes at `data`, continuing from `crc` (0 to start).
// Uses the CPU's crc32 instruction where it has one (x86 SSE4.2: 3.6x
// the table-driven form, which a table checkpoint's save and restore feel).
uint32_t Crc32c(const void* data, size_t size, uint32_t crc = 0);

// The same, table-driven: for CPUs without the instruction, and as the
// reference the tests hold the instruction's answers to.
uint32_t Crc32cPortable(const void* data, size_t size, uint32_t crc = 0);

}  // namespace shoal

#endif  // SHOAL_CORE_CRC32C_H_
