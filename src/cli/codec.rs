//! `xpackfs codec quantize|dequantize`: a codec on raw data, stdin to stdout (the
//! differential tests in tools/peers/ggml_ref.py drive it against the reference ggml).

use std::io::{Read, Write};
use std::path::PathBuf;

use crate::codec;

#[derive(Debug, clap::Args)]
pub struct CodecArgs {
    #[command(subcommand)]
    op: Op,
}

#[derive(Debug, clap::Subcommand)]
enum Op {
    /// Little-endian f32 rows on stdin -> ggml blocks on stdout (bit-exact with ggml's quantize_<type>)
    Quantize {
        /// Q8_0, Q2_K, IQ2_XXS, Q3_K, Q4_K, Q5_K, Q6_K, Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL or IQ4_XS
        #[arg(long = "type", value_parser = codec::QuantType::parse_any)]
        ty: codec::QuantType,
        #[arg(long, value_parser = crate::util::args::int_in::<usize>(1, 1 << 30))]
        n_per_row: usize,
        /// f32 file, one value per column
        #[arg(long)]
        importance: Option<PathBuf>,
        /// rayon threads (default: all cores)
        #[arg(long, value_parser = crate::util::args::int_in::<usize>(1, 1024))]
        threads: Option<usize>,
    },
    /// ggml blocks on stdin -> little-endian f32 on stdout
    Dequantize {
        /// F32, F16, BF16, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ2_XXS, MXFP4, Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL, IQ4_XS
        #[arg(long = "type")]
        ty: String,
        /// Decode 3 times in-process, print the best time in seconds to stderr, write nothing
        #[arg(long)]
        time: bool,
    },
}

fn f32s(bytes: &[u8]) -> Vec<f32> {
    bytes.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect()
}

pub fn run(a: CodecArgs) -> i32 {
    match run_op(a.op) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("xpackfs codec: {e}");
            1
        }
    }
}

fn run_op(op: Op) -> Result<(), String> {
    let mut input = Vec::new();
    std::io::stdin().read_to_end(&mut input).map_err(|e| format!("stdin: {e}"))?;
    let out: Vec<u8> = match op {
        Op::Quantize { ty, n_per_row: n, importance, threads } => {
            let importance = match importance {
                Some(p) => Some(f32s(&std::fs::read(&p).map_err(|e| format!("{}: {e}", p.display()))?)),
                None => None,
            };
            if input.len() % 4 != 0 {
                return Err("input is not a whole number of f32".into());
            }
            let src = f32s(&input);
            let g = ty.ggml();
            let rows = src.len() / n;
            let mut dst = vec![0u8; rows * (n as u64 / g.block_size * g.type_size) as usize];
            let mut run = || -> Result<(), codec::CodecError> { codec::quantize_rows_par(ty, &src, n, importance.as_deref(), &mut dst) };
            match threads {
                Some(t) => rayon::ThreadPoolBuilder::new().num_threads(t).build().map_err(|e| e.to_string())?.install(run),
                None => run(),
            }
            .map_err(|e| e.to_string())?;
            dst
        }
        Op::Dequantize { ty, time } => {
            let ty = codec::GgmlType::from_name(&ty).ok_or_else(|| format!("unknown type {ty}"))?;
            let blocks = input.len() as u64 / ty.type_size;
            let mut dst = vec![0f32; (blocks * ty.block_size) as usize];
            if time {
                let mut best = f64::MAX;
                for _ in 0..3 {
                    let t = std::time::Instant::now();
                    codec::dequantize(ty, &input, &mut dst).map_err(|e| e.to_string())?;
                    best = best.min(t.elapsed().as_secs_f64());
                }
                eprintln!("{best}");
                return Ok(());
            }
            codec::dequantize(ty, &input, &mut dst).map_err(|e| e.to_string())?;
            dst.iter().flat_map(|v| v.to_le_bytes()).collect()
        }
    };
    std::io::stdout().write_all(&out).map_err(|e| format!("stdout: {e}"))
}
