// dflash/sdk.hpp — everything a plugin author needs, in one include.
// (Include only the kind's header, e.g. <dflash/sdk/loss.hpp>, for faster builds.)
#pragma once

#include <dflash/sdk/data_source.hpp>
#include <dflash/sdk/drafter.hpp>
#include <dflash/sdk/loss.hpp>
#include <dflash/sdk/scheduler.hpp>
#include <dflash/sdk/target_model.hpp>
