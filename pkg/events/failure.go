package events

import (
	"errors"
	"fmt"
)

// FailureCode is the machine-readable reason of a prompt.failed.
type FailureCode string

// The failure codes of docs/contract.md#events.
const (
	CodeInvalidRequest   FailureCode = "invalid_request"
	CodeUnknownTemplate  FailureCode = "unknown_template"
	CodeTemplateError    FailureCode = "template_error"
	CodeInputsNotReady   FailureCode = "inputs_not_ready"
	CodeStoreUnavailable FailureCode = "store_unavailable"
	CodeBudgetExceeded   FailureCode = "budget_exceeded"
)

// Failure is why a request ends in prompt.failed: the one error type every layer returns for it
// (pkg/compose for template and budget failures, the composer for inputs and the store), so the
// code is decided where the failure is understood and carried unchanged to the answer.
type Failure struct {
	Code      FailureCode
	Message   string // never repeats the code: the answer carries both side by side
	Retryable bool
}

func (f *Failure) Error() string { return f.Message }

// Failf returns a Failure with a formatted message.
func Failf(code FailureCode, format string, args ...any) *Failure {
	return &Failure{Code: code, Message: fmt.Sprintf(format, args...)}
}

// AsFailure finds the Failure in err's chain.
func AsFailure(err error) (*Failure, bool) {
	var f *Failure
	ok := errors.As(err, &f)
	return f, ok
}
