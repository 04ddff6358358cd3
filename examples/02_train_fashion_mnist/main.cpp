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
// The defaults match a PyTorch DDP run of the same model one for one (docs/sgd.md): MLP
// 784-256-128-10, SGD lr 0.05 momentum 0.9, batch 64 per rank, pixels scaled to [0, 1] then
// normalised with Fashion-MNIST's mean 0.2860 and standard deviation 0.3530.

#include <chorus/bootstrap/local_launch.hpp>
#include <chorus/chorus.hpp>
#include <chorus/sgd/sgd.hpp>

#include <CLI/CLI.hpp>

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <numeric>
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
class Progress {
 public:
  explicit Progress(bool on) : on_(on) {}
  void update(int epoch, int epochs, std::size_t step, std::size_t steps, double loss) {
    if (!on_) return;
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
    if (!on_) return;
    std::printf("\r\033[K");
    std::fflush(stdout);
  }

 private:
  bool on_;
  Clock::time_point last_{};
};

double seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

chorus::sgd::Compression parse_compression(const std::string& s) {
  if (s == "none") return chorus::sgd::Compression::none;
  if (s == "float16") return chorus::sgd::Compression::float16;
  return chorus::sgd::Compression::bfloat16;  // CLI11 checked the value
}

template <class Comm>
int train(Comm& comm, const Config& cfg, const fmnist::Dataset& train_set, const fmnist::Dataset& test_set) {
  const int rank = comm.rank(), size = comm.size();
  const bool root = rank == 0;

  std::vector<int> sizes{int(train_set.pixels_per_image())};
  sizes.insert(sizes.end(), cfg.hidden.begin(), cfg.hidden.end());
  sizes.push_back(fmnist::kClasses);
  mlp::Mlp model(sizes);
  model.init(cfg.seed);
  // Every replica starts from rank 0's weights (here they are equal anyway: same seed).
  chorus::sgd::broadcast_parameters(comm, model.parameter_tensors(), 0);
  mlp::Sgd opt(model.parameters().size(), cfg.lr, cfg.momentum, cfg.weight_decay);
  chorus::sgd::GradientSynchronizer sync(comm, model.gradient_tensors(),
                                         {.bucket_bytes = cfg.bucket_bytes, .compression = parse_compression(cfg.compression)});
  chorus::sgd::DistributedSampler sampler(train_set.count, rank, size, /*shuffle=*/true, cfg.seed);

  const auto batch = static_cast<std::size_t>(cfg.batch);
  const std::size_t steps = (sampler.size() + batch - 1) / batch;
  std::string links = "none";  // how rank 0 reaches rank 1 (shm on one host, tcp across hosts)
  if constexpr (requires { comm.transport().link_kind(1); }) {
    if (size > 1 && root) links = std::string(comm.transport().link_kind(1));
  }
  if (root) {
    std::string arch;
    for (int s : sizes) arch += (arch.empty() ? "" : "-") + std::to_string(s);
    std::printf("02_train_fashion_mnist: %d rank%s, MLP %s (%zu parameters), SGD lr %g momentum %g, batch %d per rank "
                "(%zu global), %zu steps per epoch, %zu bucket%s of <= %zu bytes, wire %s, links %s\n",
                size, size == 1 ? "" : "s", arch.c_str(), model.parameters().size(), double(cfg.lr), double(cfg.momentum),
                cfg.batch, batch * std::size_t(size), steps, sync.bucket_count(), sync.bucket_count() == 1 ? "" : "s", sync.options().bucket_bytes,
                std::string(chorus::to_string(sync.wire_type())).c_str(), links.c_str());
    std::fflush(stdout);
  }
  Progress progress(root && !cfg.no_progress && ::isatty(STDOUT_FILENO) == 1);

  mlp::Matrix x;
  std::vector<std::uint8_t> y;
  double final_accuracy = 0;
  for (int epoch = 1; epoch <= cfg.epochs; ++epoch) {
    sampler.set_epoch(std::uint64_t(epoch - 1));
    const std::vector<std::size_t> idx = sampler.indices();
    // Sums over this rank's steps, then over the ranks.
    double loss_sum = 0, correct = 0, seen = 0, t_comp = 0, t_sync = 0;
    const auto epoch_start = Clock::now();
    for (std::size_t s = 0; s < steps; ++s) {
      const auto t0 = Clock::now();
      const std::size_t b = s * batch, e = std::min(b + batch, idx.size());
      make_batch(train_set, idx, b, e, x, y);
      const auto r = model.forward_backward(x, y, [&](std::size_t tensor) { sync.mark_ready(tensor); });
      sync.finish();
      opt.step(model.parameters(), model.gradients());
      const double step_time = seconds(Clock::now() - t0);
      const double sync_time = sync.last_step().mark_seconds + sync.last_step().finish_seconds;
      t_sync += sync_time;
      t_comp += step_time - sync_time;
      loss_sum += r.loss_sum;
      correct += double(r.correct);
      seen += double(e - b);
      progress.update(epoch, cfg.epochs, s + 1, steps, loss_sum / seen);
    }
    const double wall = seconds(Clock::now() - epoch_start);
    progress.clear();

    // Test accuracy: rank r evaluates test images r, r + P, ... (no padding: each counted once).
    double test_correct = 0;
    {
      std::vector<std::size_t> mine;
      for (std::size_t i = std::size_t(rank); i < test_set.count; i += std::size_t(size)) mine.push_back(i);
      for (std::size_t b = 0; b < mine.size(); b += 1000) {
        const std::size_t e = std::min(b + 1000, mine.size());
        make_batch(test_set, mine, b, e, x, y);
        test_correct += double(model.evaluate(x, y).correct);
      }
    }
    std::vector<double> sums{loss_sum, correct, seen, t_comp, t_sync, double(steps), test_correct};
    comm.all_reduce(std::span<double>(sums), chorus::ReduceOp::sum);
    std::vector<double> slowest{wall};
    comm.all_reduce(std::span<double>(slowest), chorus::ReduceOp::max);

    const double total_steps = sums[5];
    const double tc = sums[3] / total_steps, ts = sums[4] / total_steps;
    final_accuracy = sums[6] / double(test_set.count);
    if (root) {
      const double ratio = tc > 0 ? ts / tc : 0;
      std::string rule;
      if (size == 1) rule = "(one rank: nothing to distribute)";
      else rule = std::string(ratio < size - 1 ? "< " : ">= ") + "P-1 = " + std::to_string(size - 1) +
                  (ratio < size - 1 ? ": distribution pays" : ": distribution does not pay");
      std::printf("epoch %2d/%d  loss %.4f  train %.4f  test %.4f  %8.0f img/s  T_comp %.3f ms  T_sync %.3f ms  "
                  "T_sync/T_comp %.3f %s\n",
                  epoch, cfg.epochs, sums[0] / sums[2], sums[1] / sums[2], final_accuracy, sums[2] / slowest[0],
                  tc * 1e3, ts * 1e3, ratio, rule.c_str());
      std::fflush(stdout);
    }
  }
  // The gradient all-reduce alone: ranks aligned by a barrier, no computation to wait for or to
  // overlap. The part of T_sync above this is waiting for slower ranks (or for the CPU).
  if (size > 1) {
    constexpr int kReps = 20;
    double alone = 0;
    for (int i = 0; i < kReps; ++i) {
      comm.barrier();
      const auto t0 = Clock::now();
      sync.finish();
      alone += seconds(Clock::now() - t0);
    }
    std::vector<double> mean{alone / kReps};
    comm.all_reduce(std::span<double>(mean), chorus::ReduceOp::avg);
    if (root) std::printf("gradient all-reduce alone (after a barrier): %.3f ms per step\n", mean[0] * 1e3);
  }
  if (cfg.min_test_accuracy > 0 && final_accuracy < cfg.min_test_accuracy) {
    if (root)
      std::printf("FAILED: test accuracy %.4f is below --min-test-accuracy %.4f\n", final_accuracy, cfg.min_test_accuracy);
    return 3;
  }
  return 0;
}

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
    if (!chorus::launched_by_launcher()) return chorus::launch_local(nranks, argc, argv);

    auto comm = chorus::init();
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
      std::fprintf(stderr, "rank %d: %s\n", comm.rank(), e.what());
      return 1;
    }
    return train(comm, cfg, train_set, test_set);
  } catch (const chorus::Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 2;
  }
}
