// The transformer example (dsl-examples/transformer.mesh) as a character-level language model:
// trains the generated `LmTrain` on a text file on the mesh's ranks (thread backend), printing a
// progress line every --log-every steps, then moves the trained weights into the generated `Lm`
// program and samples text from it. Its vocabulary of 96 is newline plus printable ASCII.
//
// usage: charlm --text FILE [--steps N] [--log-every N] [--seed S] [--sample N]
//               [--prompt TEXT] [--temperature T] [--checkpoint DIR]
// The demo: scripts/charlm (GPL-3's text, which every Debian system ships in common-licenses).
#include "transformer.h"

#include "meshrt/Threads.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

using namespace meshc_generated;

namespace {

struct Options {
  std::string textPath;
  int64_t steps = 300;
  int64_t logEvery = 25;
  uint64_t seed = 1;
  int sampleChars = 240;
  std::string prompt = "This License ";
  double temperature = 0.6;
  std::string checkpointDir;
};

Options parseOptions(int argc, char** argv) {
  Options options;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) throw std::invalid_argument("charlm: " + arg + " needs a value");
      return argv[++i];
    };
    if (arg == "--text")
      options.textPath = value();
    else if (arg == "--steps")
      options.steps = std::stoll(value());
    else if (arg == "--log-every")
      options.logEvery = std::max<int64_t>(1, std::stoll(value()));
    else if (arg == "--seed")
      options.seed = std::stoull(value());
    else if (arg == "--sample")
      options.sampleChars = std::stoi(value());
    else if (arg == "--prompt")
      options.prompt = value();
    else if (arg == "--temperature")
      options.temperature = std::stod(value());
    else if (arg == "--checkpoint")
      options.checkpointDir = value();
    else
      throw std::invalid_argument("charlm: unknown option '" + arg + "'");
  }
  if (options.textPath.empty()) throw std::invalid_argument("charlm: --text FILE is required");
  return options;
}

/// Newline is token 0, the printable ASCII characters ' '..'~' are 1..95; anything else reads as
/// a space.
int tokenOf(unsigned char c) {
  if (c == '\n') return 0;
  if (c >= 32 && c <= 126) return c - 31;
  return 1;
}
char charOf(int token) {
  return token == 0 ? '\n' : char(token + 31);
}

std::vector<int> readTokens(const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  if (!file) throw std::runtime_error("charlm: cannot read '" + path + "'");
  std::string text((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
  std::vector<int> tokens;
  tokens.reserve(text.size());
  for (unsigned char c : text)
    tokens.push_back(tokenOf(c));
  return tokens;
}

/// The global [batch, seq] tokens of one step: `batch` windows at random offsets of the text,
/// drawn from (seed, step) so every rank builds the same batch.
meshc::gen::Tensor batchOf(const std::vector<int>& text, int64_t batch, int64_t seq, uint64_t seed,
                           int64_t step) {
  std::mt19937_64 rng(seed * 1000003u + uint64_t(step));
  std::uniform_int_distribution<size_t> offset(0, text.size() - size_t(seq));
  meshc::gen::Tensor tokens{{batch, seq}, meshc::gen::Buffer(size_t(batch * seq))};
  for (int64_t b = 0; b < batch; ++b) {
    size_t start = offset(rng);
    for (int64_t s = 0; s < seq; ++s)
      tokens.data[size_t(b * seq + s)] = float(text[start + size_t(s)]);
  }
  return tokens;
}

} // namespace

int main(int argc, char** argv) {
  try {
    Options options = parseOptions(argc, argv);
    std::vector<int> text = readTokens(options.textPath);
    meshrt::Mesh mesh = LmTrain::mesh();
    // The train block's one input, tokens[batch, seq]: its global shape.
    const meshc::gen::Shape shape = LmTrain::inputShape("tokens");
    const int64_t batch = shape.at(0), seq = shape.at(1);
    if (text.size() < size_t(seq) + 1) throw std::runtime_error("charlm: the text is too short");
    meshc::gen::useSingleThreadedBlas();
    std::printf("charlm: %zu characters of %s, %d ranks, batch %lld x seq %lld, %lld steps\n",
                text.size(), options.textPath.c_str(), mesh.size(), (long long)batch,
                (long long)seq, (long long)options.steps);
    std::string sample;
    meshrt::runThreads(mesh, [&](meshrt::Communicator& world) {
      LmTrain trainer(world, options.seed);
      // --checkpoint DIR: resume from its latest checkpoint if there is one; save there at the end.
      bool resume = !options.checkpointDir.empty() &&
                    std::filesystem::exists(options.checkpointDir + "/latest");
      if (resume) trainer.load(options.checkpointDir);
      if (resume && world.rank() == 0)
        std::printf("resumed from %s at step %lld\n", options.checkpointDir.c_str(),
                    (long long)trainer.stepCount());
      const int64_t firstStep = trainer.stepCount();
      auto start = std::chrono::steady_clock::now();
      double lossSum = 0;
      int64_t lossCount = 0;
      for (int64_t step = 0; step < options.steps; ++step) {
        // The batch of the global step (firstStep + step), so a resumed run sees the same data.
        LmTrain::Inputs inputs;
        inputs.tokens = LmTrain::scatterInput(
            world, "tokens", batchOf(text, batch, seq, options.seed, trainer.stepCount()));
        lossSum += trainer.step(inputs);
        ++lossCount;
        if ((step + 1) % options.logEvery == 0 || step + 1 == options.steps) {
          double seconds =
              std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
          if (world.rank() == 0)
            std::printf("step %5lld  loss %.4f  tokens/s %.0f\n", (long long)(firstStep + step + 1),
                        lossSum / double(lossCount), double((step + 1) * batch * seq) / seconds);
          std::fflush(stdout);
          lossSum = 0;
          lossCount = 0;
        }
      }
      if (!options.checkpointDir.empty()) trainer.save(options.checkpointDir);
      // The trained weights, moved into the inference program (same param paths).
      Lm model(world, options.seed);
      for (const std::string& path : Lm::paramNames())
        model.setParam(path, trainer.getParam(path));
      std::mt19937_64 rng(options.seed);
      std::vector<int> context;
      for (unsigned char c : options.prompt)
        context.push_back(tokenOf(c));
      std::string generated = options.prompt;
      for (int n = 0; n < options.sampleChars; ++n) {
        // The last `seq` tokens, left-aligned; causal attention makes the positions after the
        // last one irrelevant to its logits.
        size_t first = context.size() > size_t(seq) ? context.size() - size_t(seq) : 0;
        size_t used = context.size() - first;
        meshc::gen::Tensor tokens{{batch, seq}, meshc::gen::Buffer(size_t(batch * seq), 1.0f)};
        for (size_t s = 0; s < used; ++s)
          tokens.data[s] = float(context[first + s]);
        Lm::Inputs inputs;
        inputs.tokens = Lm::scatterInput(world, "tokens", tokens);
        auto logits = Lm::gatherOutput(world, "logits", model.run(inputs).logits);
        const int64_t vocab = logits.shape.back();
        const float* row = logits.data.data() + (used - 1) * size_t(vocab);
        std::vector<double> weights(static_cast<size_t>(vocab));
        double top = *std::max_element(row, row + vocab);
        for (int64_t v = 0; v < vocab; ++v)
          weights[size_t(v)] = std::exp((row[v] - top) / options.temperature);
        int next = int(std::discrete_distribution<int>(weights.begin(), weights.end())(rng));
        context.push_back(next);
        generated += charOf(next);
      }
      if (world.rank() == 0) sample = generated;
    });
    std::printf("\n--- sample (temperature %.2f) ---\n%s\n---\n", options.temperature,
                sample.c_str());
    return 0;
  } catch (const std::exception& error) {
    std::fprintf(stderr, "%s\n", error.what());
    return 1;
  }
}
