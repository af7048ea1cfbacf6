-- The prefill rows of each step that committed a token (the attempt's last prompt chunk, after which it
-- samples): the step model counts the LM head's logits for those rows only (docs/MODEL.md "Counting").
-- Per step and attempt, from the engine's tokens, so the rollups read per-step rows, not the tokens.
--
-- scope: task
-- reads: ev_tok, step_attribution
-- creates: sampled_prefills

CREATE OR REPLACE TEMP TABLE sampled_prefills AS
SELECT DISTINCT a.step_id, a.attempt_id
FROM step_attribution a JOIN ev_tok t ON t.step_id = a.step_id AND t.attempt_id = a.attempt_id
WHERE a.kind = 'prefill';
