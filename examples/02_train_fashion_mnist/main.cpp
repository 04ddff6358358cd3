// SPDX-License-Identifier: BSD-3-Clause
// 02_train_fashion_mnist: data-parallel training of an MLP on Fashion-MNIST with chorus's SGD
// helpers. Every rank trains on its shard (DistributedSampler), gradients are averaged every step
// by a GradientSynchronizer whose all-reduces overlap the backward pass, and the weights stay
// bitwise identical on every rank.
//
//   02_train_fashion_mnist --nranks 4 --epochs 10               # 4 local ranks
//   mpirun -np 4 02_train_fashion_mnist --no-progress           # or under mpirun or srun
//   torchrun --no_python --redirects 1 --tee 1 --nproc_per_node 4 02_train_fashion_mnist --no-progress
//
// Under torchrun the ranks join the store its agent serves on MASTER_PORT (or, with
// --rdzv_backend c10d, rank 0 serves chorus's own there); docs/torch.md, "C++ programs under
// torchrun", has the flags and the two-host command.
//
// Per epoch it prints the loss, train and test accuracy, images/s, and the measured time per step
// of computation (T_comp) and of synchronisation not hidden behind it (T_sync), next to the rule
// of docs/sgd.md: P ranks beat one process while T_sync / T_comp < P - 1.
//
// --elastic: a rank that dies does not end the run. The ranks whose collective failed with
// peer_failure shrink the communicator (Communicator::shrink), take the weights and momentum of
// the furthest survivor, re-shard the epoch for the new size and go on from where the epoch
// stood (chorus/sgd/elastic.hpp); at each epoch's end they admit processes waiting to join
// (Communicator::grow), which get the next epoch, the weights and the momentum from rank 0. Rank 0
// writes the join address to --join-file after every change; a replacement started with
// `--join --join-file PATH` joins there. Rank 0 prints a line for each change. Docs/sgd.md,
// "Elastic training", has the two-host run.
//
//   RANK=r WORLD_SIZE=4 MASTER_ADDR=h MASTER_PORT=p 02_train_fashion_mnist --elastic --join-file j
//   02_train_fashion_mnist --elastic --join --join-file j     # later: a replacement
//
// For tests, --kill-rank R --kill-epoch E --kill-step S makes rank R SIGKILL itself before step S
// of epoch E (as examples/03_torch_elastic does): a fault at the same place in every run.
//
// The defaults match a PyTorch DDP run of the same model one for one (docs/sgd.md): MLP
// 784-256-128-10, SGD lr 0.05 momentum 0.9, batch 64 per rank, pixels scaled to [0, 1] then
// normalised with Fashion-MNIST's mean 0.2860 and standard deviation 0.3530.

#include <chorus/bootstrap/local_launch.hpp>
#include <chorus/chorus.hpp>
#include <chorus/sgd/sgd.hpp>

#include <CLI/CLI.hpp>

#include <unistd.h>

#include <csignal>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <numeric>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "fashion_mnist.hpp"
#include "mlp.hpp"

namespace {

using Clock = std::chrono::steady_clock;

struct Config {
  std::string data = fmnist::kDefaultDir;
  std::vector<int> hidden = {256, 128};
  float lr = 0.05f;
  float momentum = 0.9f;
  float weight_decay = 0.0f;
  int batch = 64;
  int epochs = 10;
  std::uint64_t seed = 0;
  std::string compression = "none";
  std::size_t bucket_bytes = 0;
  double min_test_accuracy = 0;
  bool no_progress = false;
  bool elastic = false;    ///< go on after a rank fails, admit joiners at epoch ends
  std::string join_file;   ///< where rank 0 writes the join address (elastic), or the joiner reads it
  bool join = false;       ///< this process is a replacement joining a running job
  int kill_rank = -1;      ///< for tests: this rank SIGKILLs itself (as 03_torch_elastic's --kill-rank)
  int kill_epoch = 0;      ///< ... in this epoch (from 1)
  std::size_t kill_step = 0;  ///< ... before this step (from 0)
};

constexpr float kMean = 0.2860f, kStd = 0.3530f;

/// Columns of x = the images idx[begin, end) of d, normalised; y = their labels.
void make_batch(const fmnist::Dataset& d, const std::vector<std::size_t>& idx, std::size_t begin, std::size_t end,
                mlp::Matrix& x, std::vector<std::uint8_t>& y) {
  const auto px = static_cast<Eigen::Index>(d.pixels_per_image());
  x.resize(px, static_cast<Eigen::Index>(end - begin));
  y.resize(end - begin);
  for (std::size_t k = begin; k < end; ++k) {
    const std::uint8_t* img = d.image(idx[k]);
    float* col = x.col(static_cast<Eigen::Index>(k - begin)).data();
    for (Eigen::Index p = 0; p < px; ++p) col[p] = (float(img[p]) * (1.0f / 255.0f) - kMean) / kStd;
    y[k - begin] = d.labels[idx[k]];
  }
}

/// A progress bar on rank 0 when stdout is a terminal; nothing otherwise (logs get the epoch lines).
/// Rank 0 may change (elastic): each update says whether this rank is rank 0 now.
class Progress {
 public:
  explicit Progress(bool on) : on_(on) {}
  void update(bool root, int epoch, int epochs, std::size_t step, std::size_t steps, double loss) {
    if (!on_ || !root) return;
    drawn_ = true;
    const auto now = Clock::now();
    if (step != steps && now - last_ < std::chrono::milliseconds(100)) return;
    last_ = now;
    constexpr int kWidth = 30;
    const int filled = static_cast<int>(kWidth * step / std::max<std::size_t>(steps, 1));
    std::string bar(std::size_t(filled), '=');
    if (filled < kWidth) bar += '>' + std::string(std::size_t(kWidth - filled - 1), ' ');
    std::printf("\r  epoch %d/%d [%s] %3zu%% %zu/%zu loss %.4f", epoch, epochs, bar.c_str(),
                100 * step / std::max<std::size_t>(steps, 1), step, steps, loss);
    std::fflush(stdout);
  }
  void clear() {
    if (!on_ || !drawn_) return;
    drawn_ = false;
    std::printf("\r\033[K");
    std::fflush(stdout);
  }

 private:
  bool on_;
  bool drawn_ = false;
  Clock::time_point last_{};
};

double seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

chorus::sgd::Compression parse_compression(const std::string& s) {
  if (s == "none") return chorus::sgd::Compression::none;
  if (s == "float16") return chorus::sgd::Compression::float16;
  return chorus::sgd::Compression::bfloat16;  // CLI11 checked the value
}

/// Writes `text` and a newline to `path` through a file beside it and a rename, so that a reader
/// sees the old text or the new one, never a part.
void write_atomically(const std::string& path, const std::string& text) {
  const std::string aside = path + ".tmp" + std::to_string(::getpid());
  std::FILE* f = std::fopen(aside.c_str(), "w");
  bool ok = f != nullptr && std::fprintf(f, "%s\n", text.c_str()) > 0;
  if (f != nullptr) ok = std::fclose(f) == 0 && ok;
  if (!ok || std::rename(aside.c_str(), path.c_str()) != 0) {
    std::remove(aside.c_str());
    throw std::runtime_error("cannot write --join-file " + path + ": " + std::strerror(errno));
  }
}

/// The first line of `path` (the join address rank 0 wrote there).
std::string read_first_line(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  if (!in || !std::getline(in, line) || line.empty())
    throw std::runtime_error("--join: cannot read a join address from --join-file " + path +
                             " (the running job's rank 0 writes it there when started with --elastic --join-file)");
  return line;
}

std::vector<int> layer_sizes(const Config& cfg, const fmnist::Dataset& d) {
  std::vector<int> sizes{int(d.pixels_per_image())};
  sizes.insert(sizes.end(), cfg.hidden.begin(), cfg.hidden.end());
  sizes.push_back(fmnist::kClasses);
  return sizes;
}

/// Where a rank stands, for sgd::furthest: the epoch (from 1) and the steps of it completed;
/// once the epoch's results are reported, (epoch + 1, 0).
constexpr int kStepBits = 24;
constexpr std::int64_t position(int epoch, std::size_t step) { return (std::int64_t(epoch) << kStepBits) | std::int64_t(step); }
constexpr int epoch_of(std::int64_t p) { return int(p >> kStepBits); }
constexpr std::size_t step_of(std::int64_t p) { return std::size_t(p & ((std::int64_t{1} << kStepBits) - 1)); }

/// Data-parallel training of one model on the ranks of `comm`. With --elastic the ranks go on
/// after a rank fails (shrink) and admit new ones at each epoch's end (grow); `comm` is then
/// replaced by the new communicator (the caller's object, so that its address stays the same).
template <class Comm>
class Trainer {
 public:
  Trainer(Comm& comm, const Config& cfg, const fmnist::Dataset& train_set, const fmnist::Dataset& test_set)
      : comm_(comm), cfg_(cfg), train_(train_set), test_(test_set), model_(layer_sizes(cfg, train_set)),
        opt_(model_.parameters().size(), cfg.lr, cfg.momentum, cfg.weight_decay),
        progress_(!cfg.no_progress && ::isatty(STDOUT_FILENO) == 1), epochs_(cfg.epochs) {
    model_.init(cfg.seed);
  }

  /// Trains the epochs; `joined`: this process came in through Communicator::join() and gets the
  /// epoch, the weights and the momentum from rank 0. Returns the exit status.
  int run(bool joined) {
    int first_epoch = 1;
    may_kill_ = !joined;
    if (joined) {
      first_epoch = receive_admission();
    } else {
      // Every replica starts from rank 0's weights (here they are equal anyway: same seed).
      chorus::sgd::broadcast_parameters(comm_, model_.parameter_tensors(), 0);
    }
    rebuild_synchronizer();
    publish_join_address();
    if (joined)
      std::printf("02_train_fashion_mnist: joined as rank %d of %d, training from epoch %d\n", comm_.rank(), comm_.size(),
                  first_epoch);
    else if (root())
      print_header();
    std::fflush(stdout);
    for (int epoch = first_epoch; epoch <= epochs_; ++epoch) run_epoch(epoch);
    measure_all_reduce_alone();
    if (cfg_.min_test_accuracy > 0 && final_accuracy_ < cfg_.min_test_accuracy) {
      if (root())
        std::printf("FAILED: test accuracy %.4f is below --min-test-accuracy %.4f\n", final_accuracy_, cfg_.min_test_accuracy);
      return 3;
    }
    return 0;
  }

 private:
  using Sync = chorus::sgd::GradientSynchronizer<Comm, float>;

  /// Sums over this rank's steps of an epoch, then over the ranks.
  struct EpochSums {
    double loss = 0, correct = 0, seen = 0, t_comp = 0, t_sync = 0, steps = 0;
  };

  bool root() const { return comm_.rank() == 0; }

  std::vector<std::span<float>> state() { return {model_.parameters(), opt_.velocity()}; }

  void rebuild_synchronizer() {
    sync_.reset();
    sync_.emplace(comm_, model_.gradient_tensors(),
                  chorus::sgd::SyncOptions{.bucket_bytes = cfg_.bucket_bytes, .compression = parse_compression(cfg_.compression)});
  }

  /// This epoch's shard for the current world size; the order is the epoch's whatever the size.
  void shard(int epoch) {
    chorus::sgd::DistributedSampler sampler(train_.count, comm_.rank(), comm_.size(), /*shuffle=*/true, cfg_.seed);
    sampler.set_epoch(std::uint64_t(epoch - 1));
    idx_ = sampler.indices();
    steps_ = (sampler.size() + batch() - 1) / batch();
  }
  std::size_t batch() const { return static_cast<std::size_t>(cfg_.batch); }

  /// Rank 0 writes where a replacement joins (elastic mode, --join-file).
  void publish_join_address() {
    if (root() && !cfg_.join_file.empty()) write_atomically(cfg_.join_file, comm_.join_address());
  }

  void print_header() {
    std::string links = "none";  // how rank 0 reaches rank 1 (shm on one host, tcp across hosts)
    if constexpr (requires { comm_.transport().link_kind(1); }) {
      if (comm_.size() > 1) links = std::string(comm_.transport().link_kind(1));
    }
    std::string arch;
    for (int s : model_.sizes()) {
      if (!arch.empty()) arch += '-';
      arch += std::to_string(s);
    }
    const int size = comm_.size();
    std::printf("02_train_fashion_mnist: %d rank%s, MLP %s (%zu parameters), SGD lr %g momentum %g, batch %d per rank "
                "(%zu global), %zu steps per epoch, %zu bucket%s of <= %zu bytes, wire %s, links %s%s\n",
                size, size == 1 ? "" : "s", arch.c_str(), model_.parameters().size(), double(cfg_.lr), double(cfg_.momentum),
                cfg_.batch, batch() * std::size_t(size), (train_.count + batch() * std::size_t(size) - 1) / (batch() * std::size_t(size)),
                sync_->bucket_count(), sync_->bucket_count() == 1 ? "" : "s", sync_->options().bucket_bytes,
                std::string(chorus::to_string(sync_->wire_type())).c_str(), links.c_str(),
                cfg_.elastic ? ", elastic" : "");
  }

  /// One epoch, from its first step to its report (and, elastic, the admission of new ranks).
  /// With --elastic, a peer_failure anywhere in it shrinks the communicator and goes on.
  void run_epoch(int epoch) {
    EpochSums sums;
    std::size_t step = 0;
    bool reported = false;
    shard(epoch);
    const auto start = Clock::now();
    for (;;) {
      try {
        train_steps(epoch, step, sums);
        if (!reported) report(epoch, sums, seconds(Clock::now() - start));
        reported = true;
        if (cfg_.elastic && epoch < epochs_) admit_joiners(epoch);
        return;
      } catch (const chorus::Error& e) {
        if (!cfg_.elastic || e.code() != chorus::ErrorCode::peer_failure) throw;
        const Recovery r = recover(e, reported ? position(epoch + 1, 0) : position(epoch, step));
        const bool epoch_done = epoch_of(r.position) > epoch;  // the furthest rank had reported it
        if (!epoch_done) {
          shard(epoch);
          step = std::min(chorus::sgd::resume_step(step_of(r.position), r.old_size, comm_.size()), steps_);
        }
        if (root()) {
          const int n = comm_.size();
          std::printf("epoch %d: rank%s %s lost (%s): shrunk to %d rank%s in %.2f s, going on ", epoch,
                      r.lost.find(',') == std::string::npos ? "" : "s", r.lost.c_str(),
                      std::string(chorus::to_string(e.code())).c_str(), n, n == 1 ? "" : "s", r.seconds);
          if (epoch_done) std::printf("with the next epoch\n");
          else std::printf("at step %zu of %zu\n", step, steps_);
          std::fflush(stdout);
        }
        if (epoch_done) return;
      }
    }
  }

  /// Steps [step, steps_) of the epoch; `step` counts the completed ones (also when one throws).
  void train_steps(int epoch, std::size_t& step, EpochSums& sums) {
    for (; step < steps_; ++step) {
      if (comm_.rank() == cfg_.kill_rank && epoch == cfg_.kill_epoch && step == cfg_.kill_step && may_kill_) {
        std::printf("rank %d kills itself (SIGKILL) before step %zu of epoch %d (--kill-rank)\n", comm_.rank(), step, epoch);
        std::fflush(stdout);
        std::raise(SIGKILL);
      }
      const auto t0 = Clock::now();
      const std::size_t b = step * batch(), e = std::min(b + batch(), idx_.size());
      make_batch(train_, idx_, b, e, x_, y_);
      const auto r = model_.forward_backward(x_, y_, [&](std::size_t tensor) { sync_->mark_ready(tensor); });
      sync_->finish();  // a failure leaves the weights as after the last completed step
      opt_.step(model_.parameters(), model_.gradients());
      const double step_time = seconds(Clock::now() - t0);
      const double sync_time = sync_->last_step().mark_seconds + sync_->last_step().finish_seconds;
      sums.t_sync += sync_time;
      sums.t_comp += step_time - sync_time;
      sums.loss += r.loss_sum;
      sums.correct += double(r.correct);
      sums.seen += double(e - b);
      sums.steps += 1;
      progress_.update(root(), epoch, epochs_, step + 1, steps_, sums.loss / sums.seen);
    }
  }

  /// Test accuracy and the epoch's line (rank 0).
  void report(int epoch, const EpochSums& mine, double wall) {
    progress_.clear();
    const int rank = comm_.rank(), size = comm_.size();
    // Test accuracy: rank r evaluates test images r, r + P, ... (no padding: each counted once).
    double test_correct = 0;
    {
      std::vector<std::size_t> sel;
      for (std::size_t i = std::size_t(rank); i < test_.count; i += std::size_t(size)) sel.push_back(i);
      for (std::size_t b = 0; b < sel.size(); b += 1000) {
        const std::size_t e = std::min(b + 1000, sel.size());
        make_batch(test_, sel, b, e, x_, y_);
        test_correct += double(model_.evaluate(x_, y_).correct);
      }
    }
    std::vector<double> sums{mine.loss, mine.correct, mine.seen, mine.t_comp, mine.t_sync, mine.steps, test_correct};
    comm_.all_reduce(std::span<double>(sums), chorus::ReduceOp::sum);
    std::vector<double> slowest{wall};
    comm_.all_reduce(std::span<double>(slowest), chorus::ReduceOp::max);

    const double total_steps = std::max(sums[5], 1.0);
    const double tc = sums[3] / total_steps, ts = sums[4] / total_steps;
    final_accuracy_ = sums[6] / double(test_.count);
    if (rank == 0) {
      const double ratio = tc > 0 ? ts / tc : 0;
      std::string rule;
      if (size == 1) rule = "(one rank: nothing to distribute)";
      else rule = std::string(ratio < size - 1 ? "< " : ">= ") + "P-1 = " + std::to_string(size - 1) +
                  (ratio < size - 1 ? ": distribution pays" : ": distribution does not pay");
      std::printf("epoch %2d/%d  %d rank%s  loss %.4f  train %.4f  test %.4f  %8.0f img/s  T_comp %.3f ms  T_sync %.3f ms  "
                  "T_sync/T_comp %.3f %s\n",
                  epoch, epochs_, size, size == 1 ? "" : "s", sums[0] / sums[2], sums[1] / sums[2], final_accuracy_,
                  sums[2] / slowest[0], tc * 1e3, ts * 1e3, ratio, rule.c_str());
      std::fflush(stdout);
    }
  }

  /// At the end of `epoch` (elastic): admits the processes waiting in Communicator::join() and
  /// gives them the next epoch, the weights and the momentum.
  void admit_joiners(int epoch) {
    const int before = comm_.size();
    std::optional<Comm> bigger = comm_.grow();
    if (!bigger) return;
    may_kill_ = false;
    sync_.reset();
    comm_ = std::move(*bigger);
    std::vector<std::int64_t> job = job_header(epoch + 1);
    comm_.broadcast(std::span<std::int64_t>(job), 0);
    chorus::sgd::broadcast_parameters(comm_, state(), 0);
    rebuild_synchronizer();
    publish_join_address();
    if (root()) {
      const int joined = comm_.size() - before;
      std::printf("epoch %d: %d rank%s joined: %d ranks\n", epoch, joined, joined == 1 ? "" : "s", comm_.size());
      std::fflush(stdout);
    }
  }

  /// What a joiner is told: the epoch to start at, the job's epochs, and the settings that must
  /// be the same on every rank (checked by the joiner), floats as their bits.
  std::vector<std::int64_t> job_header(int next_epoch) const {
    auto bits = [](float f) { return std::int64_t(std::bit_cast<std::uint32_t>(f)); };
    return {next_epoch, epochs_, cfg_.batch, std::int64_t(cfg_.seed), bits(cfg_.lr), bits(cfg_.momentum),
            bits(cfg_.weight_decay)};
  }

  /// The joiner's side of admit_joiners: the epoch to start at, then the weights and momentum.
  int receive_admission() {
    std::vector<std::int64_t> job(job_header(0).size(), 0);
    comm_.broadcast(std::span<std::int64_t>(job), 0);
    const std::vector<std::int64_t> mine = job_header(int(job[0]));
    static constexpr const char* kNames[] = {"", "", "--batch", "--seed", "--lr", "--momentum", "--weight-decay"};
    for (std::size_t i = 2; i < job.size(); ++i)
      if (job[i] != mine[i])
        throw std::runtime_error(std::string("joiner (rank ") + std::to_string(comm_.rank()) + "): " + kNames[i] +
                                 " differs from the running job's; start the joiner with the job's settings");
    epochs_ = int(job[1]);
    chorus::sgd::broadcast_parameters(comm_, state(), 0);
    return int(job[0]);
  }

  /// What recover() did: the position the ranks go on from, the world size the epoch's steps were
  /// counted in, the ranks lost ("3" or "1, 3": ranks before the shrink) and its seconds.
  struct Recovery {
    std::int64_t position = 0;
    int old_size = 0;
    std::string lost;
    double seconds = 0;
  };

  /// After a peer_failure: the survivors shrink, agree on the furthest position (`at`: this
  /// rank's) and take its holder's weights and momentum. Shrinks again when a further rank fails
  /// meanwhile; a rank left out of the shrink gets its error.
  Recovery recover(const chorus::Error& e, std::int64_t at) {
    progress_.clear();
    std::fprintf(stderr, "rank %d: %s\n", comm_.rank(), e.what());
    const auto t0 = Clock::now();
    Recovery out;
    out.old_size = comm_.size();
    may_kill_ = false;
    std::vector<float> saved;
    for (;;) {
      const int old_rank = comm_.rank(), old_size = comm_.size();
      Comm next = comm_.shrink();
      sync_.reset();  // its requests on the old communicator failed with its abort
      comm_ = std::move(next);
      try {
        for (int r : chorus::sgd::lost_ranks(comm_, old_rank, old_size)) {
          if (!out.lost.empty()) out.lost += ", ";
          out.lost += std::to_string(r);
        }
        const chorus::sgd::Furthest f = chorus::sgd::furthest(comm_, at);
        // A broadcast cut short would leave this rank a mix of two states: keep its own.
        saved.assign(model_.parameters().begin(), model_.parameters().end());
        saved.insert(saved.end(), opt_.velocity().begin(), opt_.velocity().end());
        try {
          chorus::sgd::broadcast_parameters(comm_, state(), f.rank);
        } catch (...) {
          std::copy_n(saved.begin(), model_.parameters().size(), model_.parameters().begin());
          std::copy(saved.begin() + std::ptrdiff_t(model_.parameters().size()), saved.end(), opt_.velocity().begin());
          throw;
        }
        rebuild_synchronizer();
        publish_join_address();
        out.position = f.position;
        out.seconds = seconds(Clock::now() - t0);
        return out;
      } catch (const chorus::Error& again) {
        if (again.code() != chorus::ErrorCode::peer_failure) throw;
        std::fprintf(stderr, "rank %d: during the recovery: %s\n", comm_.rank(), again.what());
      }
    }
  }

  /// The gradient all-reduce alone: ranks aligned by a barrier, no computation to wait for or to
  /// overlap. The part of T_sync above this is waiting for slower ranks (or for the CPU).
  void measure_all_reduce_alone() {
    if (comm_.size() == 1) return;
    constexpr int kReps = 20;
    double alone = 0;
    for (int i = 0; i < kReps; ++i) {
      comm_.barrier();
      const auto t0 = Clock::now();
      sync_->finish();
      alone += seconds(Clock::now() - t0);
    }
    std::vector<double> mean{alone / kReps};
    comm_.all_reduce(std::span<double>(mean), chorus::ReduceOp::avg);
    if (root()) std::printf("gradient all-reduce alone (after a barrier): %.3f ms per step\n", mean[0] * 1e3);
  }

  Comm& comm_;
  const Config& cfg_;
  const fmnist::Dataset& train_;
  const fmnist::Dataset& test_;
  mlp::Mlp model_;
  mlp::Sgd opt_;
  Progress progress_;
  std::optional<Sync> sync_;
  std::vector<std::size_t> idx_;  ///< this rank's samples of the epoch
  std::size_t steps_ = 0;         ///< steps of the epoch at the current world size
  int epochs_;  ///< a joiner takes the job's
  bool may_kill_ = false;  ///< --kill-rank: on the starting communicator only (not a joiner, not after a change)
  double final_accuracy_ = 0;
  mlp::Matrix x_;
  std::vector<std::uint8_t> y_;
};

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Data-parallel training of an MLP on Fashion-MNIST with chorus (see docs/sgd.md)"};
  Config cfg;
  int nranks = 4;
  int missing_exit_code = 1;
  app.add_option("--nranks", nranks, "ranks to start on this host when not run by a launcher")
      ->check(CLI::Range(1, 256))->capture_default_str();
  app.add_option("--data", cfg.data, "folder of the gzip-compressed IDX files")->capture_default_str();
  app.add_option("--hidden", cfg.hidden, "hidden layer sizes, e.g. --hidden 256,128 (none: --hidden 0)")
      ->delimiter(',')->capture_default_str();
  app.add_option("--lr", cfg.lr, "learning rate")->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--momentum", cfg.momentum, "SGD momentum")->check(CLI::Range(0.0, 1.0))->capture_default_str();
  app.add_option("--weight-decay", cfg.weight_decay, "L2 weight decay")->check(CLI::NonNegativeNumber)->capture_default_str();
  app.add_option("--batch", cfg.batch, "batch size per rank")->check(CLI::Range(1, 1 << 20))->capture_default_str();
  app.add_option("--epochs", cfg.epochs, "epochs")->check(CLI::Range(1, 100000))->capture_default_str();
  app.add_option("--seed", cfg.seed, "seed of the weights and of the shuffling")->capture_default_str();
  app.add_option("--compression", cfg.compression, "wire type of the gradients")
      ->check(CLI::IsMember({"none", "float16", "bfloat16"}))->capture_default_str();
  app.add_option("--bucket-bytes", cfg.bucket_bytes, "gradient bucket size, e.g. 256K (0: CHORUS_BUCKET_BYTES, else 25 MiB)")
      ->transform(CLI::AsSizeValue(/*kb_is_1000=*/false))->capture_default_str();
  app.add_option("--min-test-accuracy", cfg.min_test_accuracy, "exit with status 3 when the final test accuracy is lower")
      ->check(CLI::Range(0.0, 1.0));
  app.add_flag("--no-progress", cfg.no_progress, "no progress bar even on a terminal (some launchers fake one)");
  app.add_option("--missing-data-exit-code", missing_exit_code,
                 "exit status when the dataset is not installed (tests use 77: skipped)")->capture_default_str();
  auto* elastic = app.add_flag("--elastic", cfg.elastic,
                               "go on when a rank dies (the survivors shrink) and admit ranks that --join at epoch ends");
  auto* join_file = app.add_option("--join-file", cfg.join_file,
                                   "elastic: rank 0 writes the join address here; with --join: read it from here")
                        ->needs(elastic);
  app.add_flag("--join", cfg.join, "join a running --elastic job as a replacement (at its next epoch end)")
      ->needs(join_file);
  auto* kill_rank = app.add_option("--kill-rank", cfg.kill_rank, "for tests: this rank SIGKILLs itself, in --kill-epoch before --kill-step");
  app.add_option("--kill-epoch", cfg.kill_epoch, "for tests: the epoch of --kill-rank (from 1)")->needs(kill_rank);
  app.add_option("--kill-step", cfg.kill_step, "for tests: the step of --kill-rank (from 0)")->needs(kill_rank)->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  std::erase(cfg.hidden, 0);
  if (std::any_of(cfg.hidden.begin(), cfg.hidden.end(), [](int h) { return h < 0; })) {
    std::fprintf(stderr, "--hidden: layer sizes must be positive\n");
    return 2;
  }

  if (const std::string missing = fmnist::missing_files_message(cfg.data); !missing.empty()) {
    std::fprintf(stderr, "%s\n", missing.c_str());
    return missing_exit_code;
  }
  try {
    if (!cfg.join && !chorus::launched_by_launcher()) return chorus::launch_local(nranks, argc, argv);

    // A joiner reads the data first: the job admits it at its next epoch end and it trains at once.
    const auto launch = chorus::detect_launch();
    const std::string who = cfg.join || !launch ? std::string("joiner") : "rank " + std::to_string(launch->rank);
    const fmnist::Files files = fmnist::files_in(cfg.data);
    fmnist::Dataset train_set, test_set;
    try {
      train_set = fmnist::load_idx(files.train_images, files.train_labels);
      test_set = fmnist::load_idx(files.test_images, files.test_labels);
      if (test_set.pixels_per_image() != train_set.pixels_per_image())
        throw fmnist::DatasetError(files.test_images + ": images are " + std::to_string(test_set.rows) + "x" +
                                   std::to_string(test_set.cols) + ", the training images " +
                                   std::to_string(train_set.rows) + "x" + std::to_string(train_set.cols));
    } catch (const fmnist::DatasetError& e) {
      std::fprintf(stderr, "%s: %s\n", who.c_str(), e.what());
      return 1;
    }
    using Comm = chorus::Communicator<chorus::DefaultTransport>;
    std::optional<Comm> comm;
    if (cfg.join) {
      chorus::Options o = chorus::Options::from_env();
      o.init_method = read_first_line(cfg.join_file);
      comm.emplace(Comm::join(std::move(o)));
    } else {
      comm.emplace(chorus::init());
    }
    return Trainer<Comm>(*comm, cfg, train_set, test_set).run(cfg.join);
  } catch (const std::runtime_error& e) {  // chorus::Error, a --join-file that cannot be read or written
    std::fprintf(stderr, "%s\n", e.what());
    return 2;
  }
}
