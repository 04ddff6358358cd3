// SPDX-License-Identifier: BSD-3-Clause
// mpi_all_reduce_perf: nccl-tests' all_reduce_perf table for MPI_Allreduce, the baseline that
// scripts/compare-bench sets beside chorus's all_reduce_perf. One source, built against Open MPI
// (openmpi_all_reduce_perf) and MPICH (mpich_all_reduce_perf); the launcher picks the transport:
//
//   mpirun.openmpi -np 4 --mca pml ob1 --mca btl tcp,self  openmpi_all_reduce_perf -b 8 -e 64M -f 4 --transport tcp
//   mpirun.openmpi -np 4 --mca pml ob1 --mca btl vader,self openmpi_all_reduce_perf -b 8 -e 64M -f 4 --transport vader
//   mpiexec.mpich -n 4 mpich_all_reduce_perf -b 8 -e 64M -f 4 --transport shm
//
// (as root, Open MPI also needs --allow-run-as-root). Flags: -b -e -i -f -n -w -c -a -d -o as in
// nccl-tests; --transport only names the transport in the header. Layout and loop:
// bench/compare/common/perf.hpp.
#define OMPI_SKIP_MPICXX 1  // the C API only: no C++ bindings to compile
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>

#include <climits>
#include <cstdio>
#include <string>

#include "compare/common/perf.hpp"

namespace {

using compare::Op;
using compare::Type;

MPI_Datatype mpi_type(Type t) {
  switch (t) {
    case Type::int8: return MPI_INT8_T;
    case Type::uint8: return MPI_UINT8_T;
    case Type::int32: return MPI_INT32_T;
    case Type::uint32: return MPI_UINT32_T;
    case Type::int64: return MPI_INT64_T;
    case Type::uint64: return MPI_UINT64_T;
    case Type::float32: return MPI_FLOAT;
    case Type::float64: return MPI_DOUBLE;
  }
  return MPI_DATATYPE_NULL;
}

MPI_Op mpi_op(Op o) {
  switch (o) {
    case Op::sum: return MPI_SUM;
    case Op::prod: return MPI_PROD;
    case Op::max: return MPI_MAX;
    case Op::min: return MPI_MIN;
  }
  return MPI_OP_NULL;
}

/// Calls that fail abort the job (MPI's default error handler, MPI_ERRORS_ARE_FATAL).
class Mpi {
 public:
  Mpi() {
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &size_);
  }
  int rank() const { return rank_; }
  int size() const { return size_; }
  void barrier() { MPI_Barrier(MPI_COMM_WORLD); }
  void all_reduce(const void* in, void* out, std::size_t count, Type t, Op op) {
    if (count > static_cast<std::size_t>(INT_MAX)) {
      std::fprintf(stderr, "mpi_all_reduce_perf: %zu elements do not fit MPI's int count\n", count);
      MPI_Abort(MPI_COMM_WORLD, 2);
    }
    MPI_Allreduce(in ? in : MPI_IN_PLACE, out, static_cast<int>(count), mpi_type(t), mpi_op(op), MPI_COMM_WORLD);
  }

 private:
  int rank_ = 0;
  int size_ = 1;
};

/// The first line of MPI_Get_library_version, tabs and runs of spaces folded.
std::string library_line() {
  char buf[MPI_MAX_LIBRARY_VERSION_STRING];
  int len = 0;
  MPI_Get_library_version(buf, &len);
  std::string line;
  for (int i = 0; i < len && buf[i] != '\n' && buf[i] != '\0'; ++i) {
    const char c = buf[i] == '\t' ? ' ' : buf[i];
    if (c == ' ' && (line.empty() || line.back() == ' ')) continue;
    line += c;
  }
  while (!line.empty() && line.back() == ' ') line.pop_back();
  return line;
}

}  // namespace

int main(int argc, char** argv) {
  ::setvbuf(stdout, nullptr, _IOLBF, 0);
  const compare::Settings s = compare::parse_settings(
      argc, argv, "mpi_all_reduce_perf: nccl-tests' all_reduce_perf table for MPI_Allreduce (start it with mpirun)",
      /*self_launching=*/false);
  MPI_Init(&argc, &argv);
  int rc = 0;
  {
#if defined(OPEN_MPI)
    const std::string library = "openmpi=" + std::to_string(OMPI_MAJOR_VERSION) + "." +
                                std::to_string(OMPI_MINOR_VERSION) + "." + std::to_string(OMPI_RELEASE_VERSION);
#elif defined(MPICH_VERSION)
    const std::string library = std::string("mpich=") + MPICH_VERSION;
#else
    const std::string library = "mpi=" + std::to_string(MPI_VERSION) + "." + std::to_string(MPI_SUBVERSION);
#endif
    Mpi mpi;
    rc = compare::Driver<Mpi>(mpi, s, library, library_line()).run();
  }
  MPI_Finalize();
  return rc;
}
