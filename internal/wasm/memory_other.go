//go:build !linux

package wasm

import "github.com/tetratelabs/wazero/experimental"

// mmapAllocator is wazero's own growth where no mapping is made here.
func mmapAllocator() experimental.MemoryAllocator { return nil }
