//! The data of one output tensor, computed in chunks of whole rows: the source rows read,
//! checked as the loader checks them (`load_data_range` with `check_tensors`: NaN or Inf in
//! a float row, a non-finite scale in a quantized one, fail the read naming the tensor),
//! then either served as they are (the type is unchanged) or decoded to f32 and encoded to
//! the output type, whose rows are checked again (`llama_tensor_quantize_impl`'s
//! `ggml_validate_row_data`). With an importance matrix, each row is quantized with the
//! slice of its expert (row / `ne1` of a 3-D tensor; the one slice of a 2-D one), as
//! `llama_tensor_quantize_impl` does. Rows are independent in every encoder, so the
//! chunking never changes the bytes.

use std::sync::Arc;

use super::codecs::{self, Encoder};
use crate::codec::GgmlType;
use crate::source::SourceFile;
use crate::view::ViewError;
use crate::view::imatrix::Imatrix;
use crate::view::tiered::ChunkPlan;

/// Output bytes per chunk (about; whole rows, at least one).
const CHUNK_BYTES: u64 = 1 << 20;

/// One tensor's rows, source to output.
pub struct TensorData {
    pub name: String,
    pub file: Arc<SourceFile>,
    pub offset: u64,
    pub src: GgmlType,
    /// None: the rows are copied (the output type is the source type).
    pub enc: Option<(GgmlType, Encoder)>,
    pub n_per_row: u64,
    pub rows: u64,
    pub rows_per_chunk: u64,
    /// The importance of the rows: the imatrix, the entry, and the rows per expert slice.
    pub importance: Option<Importance>,
}

/// Where a tensor's importance comes from: entry `entry` of `imatrix`, `n_per_row` values
/// per slice, one slice per `rows_per_expert` rows.
#[derive(Clone)]
pub struct Importance {
    pub imatrix: Arc<Imatrix>,
    pub entry: String,
    pub rows_per_expert: u64,
}

impl TensorData {
    pub fn new(name: String, file: Arc<SourceFile>, offset: u64, src: GgmlType, enc: Option<(GgmlType, Encoder)>, n_per_row: u64, rows: u64) -> Self {
        let out_row = enc.map_or(src, |e| e.0).row_bytes(n_per_row).unwrap_or(1).max(1);
        let rows_per_chunk = (CHUNK_BYTES / out_row).clamp(1, rows.max(1));
        TensorData { name, file, offset, src, enc, n_per_row, rows, rows_per_chunk, importance: None }
    }

    /// The same, quantized with `importance`.
    pub fn with_importance(mut self, importance: Option<Importance>) -> Self {
        self.importance = importance;
        self
    }

    fn src_row(&self) -> u64 {
        self.src.row_bytes(self.n_per_row).unwrap_or(0)
    }

    fn out_row(&self) -> u64 {
        self.enc.map_or(self.src, |e| e.0).row_bytes(self.n_per_row).unwrap_or(0)
    }

    pub fn chunks(&self) -> u64 {
        self.rows.div_ceil(self.rows_per_chunk)
    }

    fn content(&self, rule: String) -> ViewError {
        ViewError::Content { tensor: self.name.clone(), rule }
    }
}

impl ChunkPlan for TensorData {
    fn name(&self) -> &str {
        &self.name
    }

    fn chunk_len(&self, id: u64) -> u64 {
        let first = id * self.rows_per_chunk;
        self.rows_per_chunk.min(self.rows - first) * self.out_row()
    }

    fn compute(&self, id: u64) -> Result<Arc<[u8]>, ViewError> {
        let first = id * self.rows_per_chunk;
        let rows = self.rows_per_chunk.min(self.rows - first);
        let src_row = self.src_row();
        let mut src = vec![0u8; (rows * src_row) as usize];
        self.file.read_exact_at(&mut src, self.offset + first * src_row)?;
        // The loader's check of the source rows (llama-quantize: "tensor '...' has invalid data").
        for (r, row) in src.chunks_exact(src_row.max(1) as usize).enumerate() {
            if let Some(rule) = codecs::validate(self.src, row) {
                return Err(self.content(format!("invalid data in row {} ({rule}); llama-quantize refuses it", first + r as u64)));
            }
        }
        let Some((out_ty, enc)) = self.enc else {
            return Ok(src.into());
        };
        let n = self.n_per_row as usize;
        let mut x = vec![0f32; rows as usize * n];
        codecs::decode(self.src, &src, &mut x).map_err(|e| ViewError::Codec { tensor: self.name.clone(), source: e })?;
        drop(src);
        let out_row = self.out_row() as usize;
        let codec_err = |e| ViewError::Codec { tensor: self.name.clone(), source: e };
        let chunk = crate::view::new_chunk(rows as usize * out_row, |out| match &self.importance {
            None => codecs::encode(enc, &x, n, None, out).map_err(codec_err),
            Some(imp) => {
                // Rows in runs of one expert, each with its slice (a chunk may span experts).
                let per = imp.rows_per_expert.max(1);
                let mut r = 0u64;
                while r < rows {
                    let global = first + r;
                    let run = (per - global % per).min(rows - r);
                    let w = imp.imatrix.values(&imp.entry, (global / per) as usize * n, n)?;
                    let (a, b) = (r as usize, (r + run) as usize);
                    let out_rows = out.get_mut(a * out_row..b * out_row).ok_or_else(|| self.content("output chunk too short".into()))?;
                    codecs::encode(enc, &x[a * n..b * n], n, Some(&w), out_rows).map_err(codec_err)?;
                    r += run;
                }
                Ok(())
            }
        })?;
        for (r, row) in chunk.chunks_exact(out_row.max(1)).enumerate() {
            if let Some(rule) = codecs::validate(out_ty, row) {
                return Err(self.content(format!("quantized data validation failed in row {} ({rule})", first + r as u64)));
            }
        }
        Ok(chunk)
    }
}
