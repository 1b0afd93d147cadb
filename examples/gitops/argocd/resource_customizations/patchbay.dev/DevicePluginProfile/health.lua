-- Argo CD health check for patchbay.dev/DevicePluginProfile.
--
-- A profile's status follows the kstatus conventions: observedGeneration, and the conditions
-- Ready, Reconciling and Stalled (abnormal-true: Reconciling=True is work that can finish by
-- itself, Stalled=True work that cannot without a change), plus Degraded (devices or agents that
-- do not work). This maps them to Argo CD's health:
--   being deleted, or the operator not yet at this generation   -> Progressing
--   Stalled=True                                                -> Degraded (its message)
--   status.rollout.phase Halted (a change halted by its gate)   -> Degraded (the rollout's message)
--   spec.rollout.paused, or status.rollout.phase Paused         -> Suspended (as a paused Deployment)
--   Degraded=True                                               -> Degraded (its message)
--   status.rollout.phase Progressing (waves moving)             -> Progressing (the rollout's message)
--   Reconciling=True                                            -> Progressing (its message)
--   Ready=True                                                  -> Healthy
--   Ready=False or Unknown, or no Ready condition yet           -> Progressing
-- Only Lua 5.1 and the libraries Argo CD opens for argocd-cm scripts (base, table, package):
-- no string library, so the same text works built in and in argocd-cm.
local hs = {}

if obj.metadata ~= nil and obj.metadata.deletionTimestamp ~= nil then
  hs.status = "Progressing"
  hs.message = "Deleting: the operator is removing the resource from the nodes it set"
  return hs
end

local generation = nil
if obj.metadata ~= nil then
  generation = obj.metadata.generation
end
if obj.status == nil or obj.status.observedGeneration == nil then
  hs.status = "Progressing"
  hs.message = "Waiting for the operator to report on this profile"
  return hs
end
if generation ~= nil and obj.status.observedGeneration ~= generation then
  hs.status = "Progressing"
  hs.message = "Waiting for the operator to act on generation " .. generation
  return hs
end

local conds = {}
if obj.status.conditions ~= nil then
  for _, condition in ipairs(obj.status.conditions) do
    if condition.type ~= nil then
      conds[condition.type] = condition
    end
  end
end

local function say(condition, default)
  if condition.message ~= nil and condition.message ~= "" then
    return condition.message
  end
  if condition.reason ~= nil then
    return condition.reason
  end
  return default
end

if conds.Stalled ~= nil and conds.Stalled.status == "True" then
  hs.status = "Degraded"
  hs.message = say(conds.Stalled, "Stalled")
  return hs
end
local rollout = obj.status.rollout
if rollout == nil then
  rollout = {}
end
local function rolling(default)
  if rollout.message ~= nil and rollout.message ~= "" then
    return rollout.message
  end
  return default
end
local paused = obj.spec ~= nil and obj.spec.rollout ~= nil and obj.spec.rollout.paused == true
if rollout.phase == "Halted" then
  hs.status = "Degraded"
  hs.message = rolling("Rollout halted")
  return hs
end
if paused or rollout.phase == "Paused" then
  hs.status = "Suspended"
  hs.message = rolling("Rollout paused")
  return hs
end
if conds.Degraded ~= nil and conds.Degraded.status == "True" then
  hs.status = "Degraded"
  hs.message = say(conds.Degraded, "Degraded")
  return hs
end
if rollout.phase == "Progressing" then
  hs.status = "Progressing"
  hs.message = rolling("Rollout in progress")
  return hs
end
if conds.Reconciling ~= nil and conds.Reconciling.status == "True" then
  hs.status = "Progressing"
  hs.message = say(conds.Reconciling, "Reconciling")
  return hs
end
if conds.Ready ~= nil and conds.Ready.status == "True" then
  hs.status = "Healthy"
  hs.message = say(conds.Ready, "Ready")
  return hs
end
hs.status = "Progressing"
if conds.Ready ~= nil then
  hs.message = say(conds.Ready, "Not ready")
else
  hs.message = "Waiting for the Ready condition"
end
return hs
